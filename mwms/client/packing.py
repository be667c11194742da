"""Packs a training program's directory into a .tar.gz bundle held in a temporary file."""

from __future__ import annotations

import gzip
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mwms.errors import InvalidSpec

# Directories that never belong in a bundle: version control, bytecode caches, local virtualenvs.
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv"})


@dataclass
class PackedBundle:
    """A packed bundle: an open temporary file positioned at 0, its size and how many files it holds."""

    file: IO[bytes]
    size: int
    file_count: int

    def close(self) -> None:
        """Deletes the temporary file."""
        self.file.close()


def bundle_members(directory: Path) -> list[Path]:
    """The files under `directory` that go into its bundle, relative to it, in a stable order."""
    members: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(name for name in dirs if name not in SKIPPED_DIRS)
        for name in sorted(files):
            members.append((Path(root) / name).relative_to(directory))
    return members


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Same content -> same archive (and digest), whoever packs it.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_directory(directory: Path) -> PackedBundle:
    """Packs `directory` (skipping SKIPPED_DIRS); refuses a missing, non-directory or empty one."""
    if not directory.exists():
        raise InvalidSpec(f"{directory} does not exist; pass the directory that holds your training program")
    if not directory.is_dir():
        raise InvalidSpec(
            f"{directory} is not a directory; pass the directory that holds your training program"
        )
    members = bundle_members(directory)
    if not members:
        skipped = ", ".join(sorted(SKIPPED_DIRS))
        raise InvalidSpec(f"{directory} has no files to pack (it is empty, or holds only {skipped})")
    spooled = tempfile.TemporaryFile(prefix="mwms-bundle-", suffix=".tar.gz")
    try:
        # mtime=0 in the gzip header keeps the archive byte-identical across runs.
        with gzip.GzipFile(fileobj=spooled, mode="wb", mtime=0) as zipped:
            with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive:
                for relative in members:
                    archive.add(directory / relative, arcname=relative.as_posix(), filter=_normalise)
        size = spooled.tell()
        spooled.seek(0)
    except BaseException:
        spooled.close()
        raise
    return PackedBundle(file=spooled, size=size, file_count=len(members))


def human_size(size: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
