"""Reading an archive's entries in one bounded pass: which format it is, and what it holds.

A tar.gz is streamed through a gunzip that refuses, as soon as it is seen, more unpacked bytes, a higher
compression ratio or more time than `ArchiveLimits` allow; a zip's central directory (and the entry count
its end record declares) bounds what reading it yields. So a bomb costs a bounded amount of CPU and memory.
"""

from __future__ import annotations

import tarfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from mwms.archive_limits import (
    DEFAULT_LIMITS,
    RATIO_FLOOR_BYTES,
    ArchiveError,
    ArchiveLimitError,
    ArchiveLimits,
    ArchiveSummary,
    UnsupportedArchiveError,
    check_archive_size,
    check_deadline,
    human_size,
)

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
# Compressed bytes read per step: small enough that the ratio check fires early in a bomb.
_RAW_CHUNK = 64 * 1024
TAR_BUFFER = 16 * 1024


def archive_format(archive: Path) -> str:
    """ "tar.gz" or "zip", told by the file's magic bytes."""
    with archive.open("rb") as file:
        head = file.read(4)
    if head.startswith(GZIP_MAGIC):
        return "tar.gz"
    if head == ZIP_MAGIC:
        return "zip"
    raise UnsupportedArchiveError(
        f"the archive is neither a tar.gz nor a zip archive (starts with {head!r}); upload one of those"
    )


def inspect_archive(archive: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> ArchiveSummary:
    """Counts what `archive` holds in one bounded pass; ArchiveLimitError as soon as a limit is exceeded."""
    kind = archive_format(archive)
    if kind == "tar.gz":
        members = read_tar_members(archive, limits)
        files = sum(1 for m in members if m.isfile())
        unpacked = sum(m.size for m in members)
        return ArchiveSummary(kind, len(members), files, unpacked)
    infos = read_zip_infos(archive, limits)
    files = sum(1 for i in infos if not i.is_dir())
    return ArchiveSummary(kind, len(infos), files, sum(i.file_size for i in infos))


class _BoundedGunzip:
    """Reads a (possibly multi-member) gzip stream, inflating at most what each read asks for, and refuses
    the stream once it unpacks to more bytes, at a higher ratio or for longer than the limits allow."""

    def __init__(self, raw: BinaryIO, limits: ArchiveLimits, deadline: float) -> None:
        self._raw = raw
        self._limits = limits
        self._deadline = deadline
        self._inflater = zlib.decompressobj(wbits=31)
        self._started = False
        self.consumed = 0
        self.produced = 0

    def read(self, size: int = -1) -> bytes:
        size = size if size > 0 else TAR_BUFFER
        while True:
            check_deadline(self._deadline, self._limits)
            inflater = self._inflater
            if inflater.eof:
                # Checked first: after the end of a member its rest is in unused_data (unconsumed_tail is stale).
                data = inflater.unused_data or self._read_raw()
                if not data.startswith(GZIP_MAGIC[:1]):
                    return b""  # the end, or padding after the last member
                self._inflater = zlib.decompressobj(wbits=31)
                out = self._inflater.decompress(data, size)
            elif inflater.unconsumed_tail:
                out = inflater.decompress(inflater.unconsumed_tail, size)
            else:
                data = self._read_raw()
                if not data:
                    if self._started:
                        raise ArchiveError("the archive is damaged: its compressed data ends early")
                    return b""
                self._started = True
                out = inflater.decompress(data, size)
            if out:
                self.produced += len(out)
                self._check()
                return out

    def _read_raw(self) -> bytes:
        data = self._raw.read(_RAW_CHUNK)
        self.consumed += len(data)
        return data

    def _check(self) -> None:
        limits = self._limits
        if self.produced > limits.max_unpacked_bytes:
            raise ArchiveLimitError(
                "max_unpacked_bytes",
                f"the archive unpacks to more than {human_size(limits.max_unpacked_bytes)}",
            )
        if self.produced > RATIO_FLOOR_BYTES and self.produced > limits.max_ratio * self.consumed:
            raise ArchiveLimitError(
                "max_ratio",
                f"the archive unpacks to more than {limits.max_ratio:g} times its compressed size "
                f"({human_size(self.produced)} from the first {human_size(self.consumed)}): it looks like a bomb",
            )


def read_tar_members(archive: Path, limits: ArchiveLimits) -> list[tarfile.TarInfo]:
    """Every member of a tar.gz, read in one bounded streaming pass."""
    check_archive_size(archive, limits)
    deadline = time.monotonic() + limits.time_budget_s
    members: list[tarfile.TarInfo] = []
    declared = 0
    try:
        with archive.open("rb") as raw:
            stream = _BoundedGunzip(raw, limits, deadline)
            with tarfile.open(fileobj=stream, mode="r|", bufsize=TAR_BUFFER) as tar:  # type: ignore[call-overload]
                while (member := tar.next()) is not None:
                    members.append(member)
                    if len(members) > limits.max_entries:
                        raise ArchiveLimitError(
                            "max_entries", f"the archive holds more than {limits.max_entries} entries"
                        )
                    declared += member.size
                    if declared > limits.max_unpacked_bytes:
                        raise ArchiveLimitError(
                            "max_unpacked_bytes",
                            f"the archive unpacks to more than {human_size(limits.max_unpacked_bytes)} "
                            f"(entry {member.name!r} alone is {human_size(member.size)})",
                        )
                    check_deadline(deadline, limits)
    except (tarfile.TarError, zlib.error, EOFError) as error:
        raise ArchiveError(f"the archive is damaged: {error}") from error
    return members


def read_zip_infos(archive: Path, limits: ArchiveLimits) -> list[zipfile.ZipInfo]:
    """Every entry of a zip, from its central directory: the declared sizes bound what reading yields."""
    size = check_archive_size(archive, limits)
    deadline = time.monotonic() + limits.time_budget_s
    with archive.open("rb") as file:
        declared_entries = _zip_entry_count(file, size)
    if declared_entries is not None and declared_entries > limits.max_entries:
        raise ArchiveLimitError("max_entries", f"the archive holds more than {limits.max_entries} entries")
    try:
        with zipfile.ZipFile(archive) as zip_file:
            infos = zip_file.infolist()
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as error:
        raise ArchiveError(f"the archive is damaged: {error}") from error
    check_deadline(deadline, limits)
    if len(infos) > limits.max_entries:
        raise ArchiveLimitError("max_entries", f"the archive holds more than {limits.max_entries} entries")
    unpacked = sum(info.file_size for info in infos)
    if unpacked > limits.max_unpacked_bytes:
        raise ArchiveLimitError(
            "max_unpacked_bytes", f"the archive unpacks to more than {human_size(limits.max_unpacked_bytes)}"
        )
    if unpacked > RATIO_FLOOR_BYTES and unpacked > limits.max_ratio * size:
        raise ArchiveLimitError(
            "max_ratio",
            f"the archive unpacks to more than {limits.max_ratio:g} times its compressed size "
            f"({human_size(unpacked)} from {human_size(size)}): it looks like a bomb",
        )
    return infos


def _zip_entry_count(file: BinaryIO, size: int) -> int | None:
    """The entry count a zip's end record declares, read before the central directory is parsed."""
    tail_size = min(size, 22 + 65535)
    file.seek(size - tail_size)
    tail = file.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        return None  # not a zip: ZipFile says so
    count = int.from_bytes(tail[at + 10 : at + 12], "little")
    if count != 0xFFFF or at < 20 or tail[at - 20 : at - 16] != b"PK\x06\x07":
        return count
    # Zip64: the locator just before the end record points at the zip64 end record.
    file.seek(int.from_bytes(tail[at - 12 : at - 4], "little"))
    record = file.read(56)
    if len(record) < 40 or not record.startswith(b"PK\x06\x06"):
        return None
    return int.from_bytes(record[32:40], "little")
