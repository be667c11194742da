"""Bounded, safe reading and extraction of program bundles, artifacts and checkpoints (tar.gz or zip).

Every archive is inspected before anything is written: one streaming pass that refuses, as soon as it
is seen, more entries, more unpacked bytes, a higher compression ratio or more time than `ArchiveLimits`
allow, so a bomb costs a bounded amount of CPU, memory and disk. Extraction then also refuses absolute
paths, `..` components, links (symbolic or hard) whose target resolves outside the destination
(following the archive's own symlinks, as the filesystem would), device and fifo entries.

The limits are shared by the coordinator (which may override them through its settings) and the agent
(which uses the defaults), so both sides agree on what a bundle may be.

This module extracts archives and keeps the pool of threads archive work runs on; the limits and errors are
mwms.archive_limits', the bounded reading pass (and `inspect_archive`) mwms.archive_inspect's. The names
callers use are importable from here as well.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from mwms.archive_inspect import GZIP_MAGIC as GZIP_MAGIC
from mwms.archive_inspect import ZIP_MAGIC as ZIP_MAGIC
from mwms.archive_inspect import archive_format as archive_format
from mwms.archive_inspect import inspect_archive as inspect_archive
from mwms.archive_inspect import read_tar_members, read_zip_infos
from mwms.archive_limits import DEFAULT_LIMITS as DEFAULT_LIMITS
from mwms.archive_limits import ENVIRONMENT as ENVIRONMENT
from mwms.archive_limits import GIB as GIB
from mwms.archive_limits import MIB as MIB
from mwms.archive_limits import RATIO_FLOOR_BYTES as RATIO_FLOOR_BYTES
from mwms.archive_limits import ArchiveError as ArchiveError
from mwms.archive_limits import ArchiveLimitError as ArchiveLimitError
from mwms.archive_limits import ArchiveLimits as ArchiveLimits
from mwms.archive_limits import ArchiveSummary as ArchiveSummary
from mwms.archive_limits import UnsafeArchiveError as UnsafeArchiveError
from mwms.archive_limits import UnsupportedArchiveError as UnsupportedArchiveError
from mwms.archive_limits import limit_exceeded as limit_exceeded

# More symlink hops than this while resolving a path means a loop.
MAX_SYMLINK_HOPS = 40
# A zip symlink entry holds its target; anything longer than a path is not a link.
MAX_LINK_TARGET_BYTES = 4096
T = TypeVar("T")


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


def _extract_tar(archive: Path, dest: Path, limits: ArchiveLimits) -> None:
    members = read_tar_members(archive, limits)
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
    infos = read_zip_infos(archive, limits)
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
