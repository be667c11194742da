"""Safe and bounded extraction of tar.gz and zip bundles (the agent's and the coordinator's)."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from mwms.archive import (
    ArchiveError,
    ArchiveLimitError,
    ArchiveLimits,
    UnsafeArchiveError,
    UnsupportedArchiveError,
    extract_archive,
    inspect_archive,
)
from mwms_testkit.bombs import GIB, MIB, gzip_bomb, many_entries_bomb, tar_header, zip_bomb


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


# --- limits: bombs are refused in one bounded pass, before anything is written ----------------------

SMALL = ArchiveLimits(max_entries=1000, max_unpacked_bytes=256 * MIB, max_ratio=50, time_budget_s=10)


@pytest.mark.parametrize(
    ("make", "limit"),
    [
        (lambda path: gzip_bomb(path / "g.tar.gz", 10 * GIB), "MWMS_ARCHIVE_MAX_RATIO"),
        (lambda path: zip_bomb(path / "z.zip", 64), "MWMS_ARCHIVE_MAX_RATIO"),
        (lambda path: many_entries_bomb(path / "t.tar.gz", 1 << 20), "MWMS_ARCHIVE_MAX_ENTRIES"),
    ],
)
def test_bombs_are_refused_quickly_with_the_default_limits(tmp_path: Path, make, limit: str) -> None:
    archive = make(tmp_path)
    dest = tmp_path / "dest"
    started = time.monotonic()
    with pytest.raises(ArchiveLimitError, match=limit):
        extract_archive(archive, dest)
    assert time.monotonic() - started < 5
    assert not any(dest.iterdir())


def test_each_limit_is_enforced_and_named(tmp_path: Path) -> None:
    ratio_free = ArchiveLimits(max_ratio=1e9, max_unpacked_bytes=200 * MIB)
    cases = [
        (gzip_bomb(tmp_path / "g.tar.gz", 256 * MIB), ratio_free, "unpacks to more than 200 MiB"),
        (zip_bomb(tmp_path / "z.zip", 4), ratio_free, "unpacks to more than 200 MiB"),
        (many_entries_bomb(tmp_path / "t.tar.gz", 4096), SMALL, "more than 1000 entries"),
        (
            make_tar(tmp_path / "big.tar.gz", [file_entry("a.txt", b"x" * 5000)]),
            ArchiveLimits(max_archive_bytes=100),
            "MWMS_MAX_UPLOAD_BYTES",
        ),
        (
            make_tar(tmp_path / "ok.tar.gz", [file_entry("a.txt")]),
            ArchiveLimits(time_budget_s=1e-9),
            "took longer",
        ),
    ]
    for archive, limits, message in cases:
        dest = tmp_path / f"dest-{archive.name}"
        with pytest.raises(ArchiveLimitError, match=message):
            extract_archive(archive, dest, limits)
        assert not any(dest.iterdir()), archive.name


def test_a_huge_declared_entry_is_refused_from_its_header(tmp_path: Path) -> None:
    # A tar header may claim any size: 1 TiB is refused at once, without inflating anything.
    archive = tmp_path / "huge.tar.gz"
    archive.write_bytes(gzip.compress(tar_header("huge.bin", 1024**4) + bytes(1 << 20)))
    started = time.monotonic()
    with pytest.raises(ArchiveLimitError, match="'huge.bin' alone is 1024 GiB"):
        inspect_archive(archive)
    assert time.monotonic() - started < 1


def test_zip_entry_count_is_read_from_the_end_record_before_the_directory(tmp_path: Path) -> None:
    archive = tmp_path / "many.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for index in range(1001):
            zf.writestr(f"f{index}", "")
    with pytest.raises(ArchiveLimitError, match="more than 1000 entries"):
        inspect_archive(archive, SMALL)
    assert inspect_archive(archive).entries == 1001


def test_archives_within_the_limits_are_summarised_and_extracted(tmp_path: Path) -> None:
    # 32 MiB of zeros is a legitimate (if odd) file: under the ratio floor, whatever its ratio.
    archive = gzip_bomb(tmp_path / "zeros.tar.gz", 32 * MIB, piece=32 * MIB)
    summary = inspect_archive(archive, SMALL)
    assert (summary.format, summary.files, summary.unpacked_bytes) == ("tar.gz", 1, 32 * MIB)
    dest = tmp_path / "dest"
    extract_archive(archive, dest, SMALL)
    assert (dest / "zeros.bin").stat().st_size == 32 * MIB
    multi = make_tar(tmp_path / "m.tar.gz", [file_entry("a/b.txt", b"b"), file_entry("c.txt", b"c")])
    assert inspect_archive(multi).files == 2


def test_a_failed_write_removes_what_it_wrote(tmp_path: Path) -> None:
    archive = tmp_path / "b.tar.gz"
    data = make_tar(tmp_path / "ok.tar.gz", [file_entry("a.txt", b"a" * 100_000), file_entry("b.txt")])
    archive.write_bytes(data.read_bytes()[:-200])  # the gzip trailer and the end blocks cut off
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "kept.txt").write_text("was here before")
    with pytest.raises(ArchiveError):
        extract_archive(archive, dest)
    assert [p.name for p in dest.iterdir()] == ["kept.txt"]
