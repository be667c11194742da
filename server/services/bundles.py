"""Program bundles: .tar.gz or .zip archives stored once per sha256 digest."""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.orm import Session

from server.db.models import Bundle
from server.errors import InvalidInput, NotFound

CHUNK = 1024 * 1024


def sniff_format(head: bytes) -> str | None:
    """ "tar.gz" or "zip" from an archive's first bytes, None for anything else."""
    if head.startswith(b"\x1f\x8b"):
        return "tar.gz"
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    return None


def spool_upload(source: BinaryIO, bundle_dir: Path, max_bytes: int) -> tuple[Path, str, int, str]:
    """Copies an upload to a temp file under bundle_dir, hashing as it goes; checks the archive.

    Returns (temp path, digest, size, format). Raises InvalidInput for empty, oversized or
    non-archive uploads, and for archives with no files in them.
    """
    bundle_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(dir=bundle_dir, suffix=".upload")
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise InvalidInput(f"bundle is larger than the limit of {max_bytes} bytes")
                digest.update(chunk)
                out.write(chunk)
        if size == 0:
            raise InvalidInput("the bundle is empty: upload a .tar.gz or .zip of your program's directory")
        with path.open("rb") as f:
            archive_format = sniff_format(f.read(8))
        if archive_format is None:
            raise InvalidInput("the bundle is not a .tar.gz or .zip archive: pack your program directory")
        if _count_files(path, archive_format) == 0:
            raise InvalidInput("the bundle holds no files: pack the directory that contains your program")
        return path, digest.hexdigest(), size, archive_format
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _count_files(path: Path, archive_format: str) -> int:
    try:
        if archive_format == "zip":
            with zipfile.ZipFile(path) as archive:
                return sum(1 for info in archive.infolist() if not info.is_dir())
        with tarfile.open(path, "r:gz") as archive:
            return sum(1 for member in archive if member.isfile())
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as error:
        raise InvalidInput(f"the bundle is not a readable {archive_format} archive ({error})") from error


def record_bundle(
    session: Session,
    bundle_dir: Path,
    spooled: Path,
    digest: str,
    size: int,
    archive_format: str,
    filename: str,
) -> tuple[Bundle, bool]:
    """Moves a spooled upload into place under its digest; returns (bundle, created)."""
    existing = session.get(Bundle, digest)
    final = bundle_dir / digest
    if existing is not None and final.exists():
        spooled.unlink(missing_ok=True)
        return existing, False
    os.replace(spooled, final)
    if existing is not None:
        return existing, False
    bundle = Bundle(digest=digest, size=size, archive_format=archive_format, filename=filename[:255])
    session.add(bundle)
    session.flush()
    return bundle, True


def bundle_path(session: Session, bundle_dir: Path, digest: str) -> Path:
    """The stored archive of `digest`; NotFound when it was never uploaded."""
    if session.get(Bundle, digest) is None or not (bundle_dir / digest).exists():
        raise NotFound(f"no bundle with digest {digest}; upload it with POST /api/v1/bundles first")
    return bundle_dir / digest
