"""Safe extraction of tar.gz and zip bundles."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from mwms.archive import UnsafeArchiveError, UnsupportedArchiveError, extract_archive


def make_tar(path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def file_entry(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def link_entry(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def test_tar_gz_extracts_files_dirs_and_executable_bit(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "b.tar.gz",
        [file_entry("train.py", b"print(1)\n"), file_entry("bin/run.sh", b"#!/bin/sh\n", mode=0o755)],
    )
    dest = tmp_path / "dest"
    extract_archive(archive, dest)
    assert (dest / "train.py").read_bytes() == b"print(1)\n"
    assert os.access(dest / "bin" / "run.sh", os.X_OK)


def test_zip_extracts_and_keeps_executable_bit(tmp_path: Path) -> None:
    archive = tmp_path / "b.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/train.py", "print(1)\n")
        info = zipfile.ZipInfo("run.sh")
        info.external_attr = (stat.S_IFREG | 0o755) << 16
        zf.writestr(info, "#!/bin/sh\n")
    dest = tmp_path / "dest"
    extract_archive(archive, dest)
    assert (dest / "pkg" / "train.py").read_text() == "print(1)\n"
    assert os.access(dest / "run.sh", os.X_OK)


def test_link_inside_the_bundle_is_fine(tmp_path: Path) -> None:
    archive = make_tar(
        tmp_path / "b.tar.gz",
        [
            file_entry("data/a.txt", b"a"),
            link_entry("alias.txt", "data/a.txt"),
            link_entry("hard.txt", "data/a.txt", tarfile.LNKTYPE),
        ],
    )
    dest = tmp_path / "dest"
    extract_archive(archive, dest)
    assert (dest / "alias.txt").is_symlink()
    assert (dest / "alias.txt").read_text() == "a"
    assert (dest / "hard.txt").read_text() == "a"


def test_empty_archive_gives_empty_dir(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    extract_archive(make_tar(tmp_path / "b.tar.gz", []), dest)
    assert dest.is_dir() and not any(dest.iterdir())


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ([file_entry("ok.txt"), file_entry("../x")], "../x"),
        ([file_entry("ok.txt"), file_entry("/etc/evil")], "/etc/evil"),
        ([file_entry("ok.txt"), link_entry("escape", "../../outside")], "escape"),
        ([file_entry("ok.txt"), link_entry("abs", "/etc/passwd")], "abs"),
        ([file_entry("ok.txt"), link_entry("hard", "../outside", tarfile.LNKTYPE)], "hard"),
        # Each link stays inside on its own; followed together they leave the bundle.
        ([file_entry("ok.txt"), link_entry("here", "."), link_entry("up", "here/..")], "up"),
        ([file_entry("ok.txt"), link_entry("dir", ".."), file_entry("dir/evil")], "'dir'"),
        ([file_entry("ok.txt"), link_entry("fifo", "", tarfile.FIFOTYPE)], "fifo"),
        ([file_entry("ok.txt"), link_entry("dev", "", tarfile.CHRTYPE)], "dev"),
    ],
)
def test_unsafe_tar_is_refused_before_anything_is_written(
    tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]], named: str
) -> None:
    archive = make_tar(tmp_path / "b.tar.gz", entries)
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchiveError, match=named.replace(".", r"\.")):
        extract_archive(archive, dest)
    assert not any(dest.iterdir())


def test_zip_with_dotdot_or_escaping_symlink_is_refused(tmp_path: Path) -> None:
    for name, make in [
        ("../x", lambda zf: zf.writestr("../x", "x")),
        ("link", lambda zf: zf.writestr(_zip_symlink("link"), "../outside")),
    ]:
        archive = tmp_path / "b.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr("ok.txt", "ok")
            make(zf)
        dest = tmp_path / f"dest-{len(name)}"
        with pytest.raises(UnsafeArchiveError, match=name.replace(".", r"\.")):
            extract_archive(archive, dest)
        assert not any(dest.iterdir())


def _zip_symlink(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


def test_unknown_format_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    archive = tmp_path / "b.bin"
    archive.write_bytes(b"hello world")
    with pytest.raises(UnsupportedArchiveError, match="neither a tar.gz nor a zip"):
        extract_archive(archive, tmp_path / "dest")
