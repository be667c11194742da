"""Bounded, safe reading and extraction of program bundles, artifacts and checkpoints (tar.gz or zip).

Every archive is inspected before anything is written: one streaming pass that refuses, as soon as it
is seen, more entries, more unpacked bytes, a higher compression ratio or more time than `ArchiveLimits`
allow, so a bomb costs a bounded amount of CPU, memory and disk. Extraction then also refuses absolute
paths, `..` components, links (symbolic or hard) whose target resolves outside the destination
(following the archive's own symlinks, as the filesystem would), device and fifo entries.

The limits are shared by the coordinator (which may override them through its settings) and the agent
(which uses the defaults), so both sides agree on what a bundle may be.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
import tarfile
import threading
import time
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
# More symlink hops than this while resolving a path means a loop.
MAX_SYMLINK_HOPS = 40
GIB = 1024**3
MIB = 1024**2
# Archives that unpack to less than this are never refused for their ratio: a small file of zeros is fine.
RATIO_FLOOR_BYTES = 64 * MIB
# A zip symlink entry holds its target; anything longer than a path is not a link.
MAX_LINK_TARGET_BYTES = 4096
# Compressed bytes read per step: small enough that the ratio check fires early in a bomb.
_RAW_CHUNK = 64 * 1024
_TAR_BUFFER = 16 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class ArchiveLimits:
    """What an archive may hold. The one home of the defaults; `ENVIRONMENT` names their MWMS_ settings."""

    # The archive itself: an upload, a fetched bundle or checkpoint.
    max_archive_bytes: int = 2 * GIB
    # Files, directories and links together.
    max_entries: int = 50_000
    # Everything the archive unpacks to (for tar: the whole uncompressed tar stream).
    max_unpacked_bytes: int = 8 * GIB
    # Unpacked bytes per compressed byte, checked once more than RATIO_FLOOR_BYTES are unpacked.
    max_ratio: float = 200.0
    # Wall-clock seconds the inspection of one archive may take.
    time_budget_s: float = 60.0


DEFAULT_LIMITS = ArchiveLimits()
# The coordinator's setting for each limit (server/settings.py); error messages name them.
ENVIRONMENT = {
    "max_archive_bytes": "MWMS_MAX_UPLOAD_BYTES",
    "max_entries": "MWMS_ARCHIVE_MAX_ENTRIES",
    "max_unpacked_bytes": "MWMS_ARCHIVE_MAX_UNPACKED_BYTES",
    "max_ratio": "MWMS_ARCHIVE_MAX_RATIO",
    "time_budget_s": "MWMS_ARCHIVE_TIME_BUDGET_S",
}


class ArchiveError(Exception):
    """The archive cannot be extracted; the message says why."""


class UnsafeArchiveError(ArchiveError):
    """An entry would write outside the destination or create something other than files, dirs and links."""


class UnsupportedArchiveError(ArchiveError):
    """The file is neither a gzip-compressed tar nor a zip."""


class ArchiveLimitError(ArchiveError):
    """The archive exceeds one of the `ArchiveLimits`; `limit` is the field's name."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(f"{message} (limit {ENVIRONMENT[limit]})")
        self.limit = limit


@dataclass(frozen=True)
class ArchiveSummary:
    """What an inspected archive holds."""

    format: str
    entries: int
    files: int
    unpacked_bytes: int


def limit_exceeded(limit: str, value: int, limits: ArchiveLimits) -> ArchiveLimitError:
    """The error for an archive (or upload) of `value` bytes over `limit`."""
    bound = getattr(limits, limit)
    return ArchiveLimitError(
        limit, f"the archive is larger than the limit of {_size(bound)} ({value}+ bytes)"
    )


class ArchiveWorkers:
    """A bounded pool of threads of its own for archive work, so that checking or writing uploads never
    takes the threads that the event loop's other work (gRPC heartbeats, REST requests) runs on."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="mwms-archive")

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """Runs `fn(*args)` in the pool; waits (without holding any other thread) for a free worker."""
        return await asyncio.wrap_future(self._executor.submit(fn, *args))


_workers: dict[int, ArchiveWorkers] = {}
_workers_guard = threading.Lock()


def archive_workers(max_workers: int) -> ArchiveWorkers:
    """The process's pool of `max_workers` archive threads (created on first use, shared afterwards)."""
    with _workers_guard:
        if max_workers not in _workers:
            _workers[max_workers] = ArchiveWorkers(max_workers)
        return _workers[max_workers]


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
        members = _read_tar_members(archive, limits)
        files = sum(1 for m in members if m.isfile())
        unpacked = sum(m.size for m in members)
        return ArchiveSummary(kind, len(members), files, unpacked)
    infos = _read_zip_infos(archive, limits)
    files = sum(1 for i in infos if not i.is_dir())
    return ArchiveSummary(kind, len(infos), files, sum(i.file_size for i in infos))


def extract_archive(archive: Path, dest: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> None:
    """Extracts `archive` into `dest` (created if missing) after checking every entry and the limits.

    Nothing is written when a check fails; what a failed write left in `dest` is removed again.
    """
    kind = archive_format(archive)
    dest.mkdir(parents=True, exist_ok=True)
    existing = set(os.listdir(dest))
    try:
        if kind == "tar.gz":
            _extract_tar(archive, dest, limits)
        else:
            _extract_zip(archive, dest, limits)
    except BaseException:
        for name in set(os.listdir(dest)) - existing:
            path = dest / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise


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
        size = size if size > 0 else _TAR_BUFFER
        while True:
            _check_deadline(self._deadline, self._limits)
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
                "max_unpacked_bytes", f"the archive unpacks to more than {_size(limits.max_unpacked_bytes)}"
            )
        if self.produced > RATIO_FLOOR_BYTES and self.produced > limits.max_ratio * self.consumed:
            raise ArchiveLimitError(
                "max_ratio",
                f"the archive unpacks to more than {limits.max_ratio:g} times its compressed size "
                f"({_size(self.produced)} from the first {_size(self.consumed)}): it looks like a bomb",
            )


def _read_tar_members(archive: Path, limits: ArchiveLimits) -> list[tarfile.TarInfo]:
    """Every member of a tar.gz, read in one bounded streaming pass."""
    _check_archive_size(archive, limits)
    deadline = time.monotonic() + limits.time_budget_s
    members: list[tarfile.TarInfo] = []
    declared = 0
    try:
        with archive.open("rb") as raw:
            stream = _BoundedGunzip(raw, limits, deadline)
            with tarfile.open(fileobj=stream, mode="r|", bufsize=_TAR_BUFFER) as tar:  # type: ignore[call-overload]
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
                            f"the archive unpacks to more than {_size(limits.max_unpacked_bytes)} "
                            f"(entry {member.name!r} alone is {_size(member.size)})",
                        )
                    _check_deadline(deadline, limits)
    except (tarfile.TarError, zlib.error, EOFError) as error:
        raise ArchiveError(f"the archive is damaged: {error}") from error
    return members


def _read_zip_infos(archive: Path, limits: ArchiveLimits) -> list[zipfile.ZipInfo]:
    """Every entry of a zip, from its central directory: the declared sizes bound what reading yields."""
    size = _check_archive_size(archive, limits)
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
    _check_deadline(deadline, limits)
    if len(infos) > limits.max_entries:
        raise ArchiveLimitError("max_entries", f"the archive holds more than {limits.max_entries} entries")
    unpacked = sum(info.file_size for info in infos)
    if unpacked > limits.max_unpacked_bytes:
        raise ArchiveLimitError(
            "max_unpacked_bytes", f"the archive unpacks to more than {_size(limits.max_unpacked_bytes)}"
        )
    if unpacked > RATIO_FLOOR_BYTES and unpacked > limits.max_ratio * size:
        raise ArchiveLimitError(
            "max_ratio",
            f"the archive unpacks to more than {limits.max_ratio:g} times its compressed size "
            f"({_size(unpacked)} from {_size(size)}): it looks like a bomb",
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


def _check_archive_size(archive: Path, limits: ArchiveLimits) -> int:
    size = archive.stat().st_size
    if size > limits.max_archive_bytes:
        raise limit_exceeded("max_archive_bytes", size, limits)
    return size


def _check_deadline(deadline: float, limits: ArchiveLimits) -> None:
    if time.monotonic() > deadline:
        raise ArchiveLimitError(
            "time_budget_s", f"reading the archive took longer than {limits.time_budget_s:g} s"
        )


def _size(value: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{int(value)} bytes"


def _extract_tar(archive: Path, dest: Path, limits: ArchiveLimits) -> None:
    members = _read_tar_members(archive, limits)
    symlinks = {tuple(_entry_parts(m.name)): m.linkname for m in members if m.issym()}
    for member in members:
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeArchiveError(f"entry {member.name!r} is a device or fifo; bundles hold files only")
        _check_entry(member.name, symlinks)
        if member.issym():
            _check_link_target(member.name, member.linkname, relative_to_entry=True, symlinks=symlinks)
        elif member.islnk():
            _check_link_target(member.name, member.linkname, relative_to_entry=False, symlinks=symlinks)
    if not hasattr(tarfile, "data_filter"):  # added in 3.10.12 and 3.11.4; requires-python cannot say so
        raise ArchiveError(
            f"this Python ({sys.version.split()[0]}) has no tarfile extraction filters: "
            "use Python 3.10.12, 3.11.4 or later to unpack bundles"
        )
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # The members found above (their offsets hold in this file too): one more pass, forward only.
            # The "data" filter repeats the checks against the real filesystem while writing.
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, zlib.error, EOFError) as error:
        raise ArchiveError(f"the archive is damaged: {error}") from error


def _extract_zip(archive: Path, dest: Path, limits: ArchiveLimits) -> None:
    infos = _read_zip_infos(archive, limits)
    try:
        with zipfile.ZipFile(archive) as zip_file:
            symlinks: dict[tuple[str, ...], str] = {}
            for info in infos:
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    if info.file_size > MAX_LINK_TARGET_BYTES:
                        raise UnsafeArchiveError(
                            f"link {info.filename!r} has a target of {info.file_size} bytes"
                        )
                    target = zip_file.read(info).decode("utf-8", "replace")
                    symlinks[tuple(_entry_parts(info.filename))] = target
                elif stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise UnsafeArchiveError(
                        f"entry {info.filename!r} is a device or fifo; bundles hold files only"
                    )
            for info in infos:
                _check_entry(info.filename, symlinks)
            for name, target in symlinks.items():
                _check_link_target("/".join(name), target, relative_to_entry=True, symlinks=symlinks)
            for info in infos:
                _write_zip_entry(zip_file, info, dest, symlinks)
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise ArchiveError(f"the archive is damaged: {error}") from error


def _write_zip_entry(
    zip_file: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path, symlinks: dict[tuple[str, ...], str]
) -> None:
    parts = _entry_parts(info.filename)
    if not parts:
        return
    target = dest.joinpath(*parts)
    if info.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    link_target = symlinks.get(tuple(parts))
    if link_target is not None:
        os.symlink(link_target, target)
        return
    with zip_file.open(info) as source, target.open("wb") as out:
        shutil.copyfileobj(source, out)
    permissions = (info.external_attr >> 16) & 0o777
    if permissions:
        # Keep the executable bits; never make files group- or world-writable.
        target.chmod((permissions | 0o600) & ~0o022)


def _entry_parts(name: str) -> list[str]:
    return [part for part in name.split("/") if part not in ("", ".")]


def _check_entry(name: str, symlinks: dict[tuple[str, ...], str]) -> None:
    if name.startswith("/"):
        raise UnsafeArchiveError(f"entry {name!r} has an absolute path")
    parts = _entry_parts(name)
    if ".." in parts:
        raise UnsafeArchiveError(f"entry {name!r} has a '..' component")
    # Writing the entry follows symlinks in its parent directories (created by earlier entries).
    if parts and _resolve_inside(parts[:-1], symlinks) is None:
        raise UnsafeArchiveError(f"entry {name!r} would be written through a link that leaves the bundle")


def _check_link_target(
    name: str, target: str, *, relative_to_entry: bool, symlinks: dict[tuple[str, ...], str]
) -> None:
    if target.startswith("/"):
        raise UnsafeArchiveError(f"link {name!r} points to the absolute path {target!r}")
    base = _entry_parts(name)[:-1] if relative_to_entry else []
    if _resolve_inside(base + target.split("/"), symlinks) is None:
        raise UnsafeArchiveError(f"link {name!r} points to {target!r}, outside the bundle")


def _resolve_inside(parts: list[str], symlinks: dict[tuple[str, ...], str]) -> list[str] | None:
    """The path's components after following the archive's symlinks; None when it leaves the root."""
    resolved: list[str] = []
    pending = list(parts)
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                return None
            resolved.pop()
            continue
        resolved.append(part)
        target = symlinks.get(tuple(resolved))
        if target is None:
            continue
        hops += 1
        if hops > MAX_SYMLINK_HOPS or target.startswith("/"):
            return None
        resolved.pop()
        pending = target.split("/") + pending
    return resolved
