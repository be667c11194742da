"""Packing a directory into a bundle: what goes in, what stays out, what is refused."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from mwms.client.packing import human_size, pack_directory
from mwms.errors import InvalidSpec


def _names(directory: Path) -> list[str]:
    bundle = pack_directory(directory)
    try:
        data = bundle.file.read()
        assert len(data) == bundle.size
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            return sorted(member.name for member in archive.getmembers() if member.isfile())
    finally:
        bundle.close()


def test_nested_files_are_kept_and_caches_skipped(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "model.py").write_text("x = 1\n")
    for skipped in (".git", "__pycache__", ".venv", "pkg/__pycache__"):
        (tmp_path / skipped).mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped / "junk").write_text("junk")
    assert _names(tmp_path) == ["pkg/sub/model.py", "train.py"]


def test_archive_is_reproducible(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    first, second = pack_directory(tmp_path), pack_directory(tmp_path)
    try:
        assert first.file.read() == second.file.read()
    finally:
        first.close()
        second.close()


def test_gzip_header_has_no_timestamp(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    bundle = pack_directory(tmp_path)
    try:
        with gzip.GzipFile(fileobj=bundle.file) as zipped:
            zipped.read()
            assert zipped.mtime == 0
    finally:
        bundle.close()


def test_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="does not exist"):
        pack_directory(tmp_path / "nope")


def test_file_instead_of_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    with pytest.raises(InvalidSpec, match="not a directory"):
        pack_directory(tmp_path / "train.py")


def test_empty_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="no files to pack"):
        pack_directory(tmp_path)


def test_directory_with_only_skipped_content_is_refused(tmp_path: Path) -> None:
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"\0")
    with pytest.raises(InvalidSpec, match="no files to pack"):
        pack_directory(tmp_path)


@pytest.mark.parametrize(
    ("size", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * 1024**3, "5.0 GiB")]
)
def test_human_size(size: int, text: str) -> None:
    assert human_size(size) == text
