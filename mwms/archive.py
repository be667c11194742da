"""Safe extraction of program bundles (tar.gz or zip): every entry is checked before anything is written.

Refused: absolute paths, `..` components, links (symbolic or hard) whose target resolves outside the
destination (following the archive's own symlinks, as the filesystem would), device and fifo entries.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
# More symlink hops than this while resolving a path means a loop.
MAX_SYMLINK_HOPS = 40


class ArchiveError(Exception):
    """The archive cannot be extracted; the message says why."""


class UnsafeArchiveError(ArchiveError):
    """An entry would write outside the destination or create something other than files, dirs and links."""


class UnsupportedArchiveError(ArchiveError):
    """The file is neither a gzip-compressed tar nor a zip."""


def archive_format(archive: Path) -> str:
    """ "tar.gz" or "zip", told by the file's magic bytes."""
    with archive.open("rb") as file:
        head = file.read(4)
    if head.startswith(GZIP_MAGIC):
        return "tar.gz"
    if head == ZIP_MAGIC:
        return "zip"
    raise UnsupportedArchiveError(
        f"the bundle is neither a tar.gz nor a zip archive (starts with {head!r}); upload one of those"
    )


def extract_archive(archive: Path, dest: Path) -> None:
    """Extracts `archive` into `dest` (created if missing) after checking every entry."""
    kind = archive_format(archive)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "tar.gz":
            _extract_tar(archive, dest)
        else:
            _extract_zip(archive, dest)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as error:
        raise ArchiveError(f"the bundle archive is damaged: {error}") from error


def _extract_tar(archive: Path, dest: Path) -> None:
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        symlinks = {tuple(_entry_parts(m.name)): m.linkname for m in members if m.issym()}
        for member in members:
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                raise UnsafeArchiveError(
                    f"entry {member.name!r} is a device or fifo; bundles hold files only"
                )
            _check_entry(member.name, symlinks)
            if member.issym():
                _check_link_target(member.name, member.linkname, relative_to_entry=True, symlinks=symlinks)
            elif member.islnk():
                _check_link_target(member.name, member.linkname, relative_to_entry=False, symlinks=symlinks)
        # The "data" filter repeats these checks against the real filesystem while writing.
        tar.extractall(dest, filter="data")


def _extract_zip(archive: Path, dest: Path) -> None:
    with zipfile.ZipFile(archive) as zip_file:
        infos = zip_file.infolist()
        symlinks: dict[tuple[str, ...], str] = {}
        for info in infos:
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                symlinks[tuple(_entry_parts(info.filename))] = zip_file.read(info).decode("utf-8", "replace")
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
