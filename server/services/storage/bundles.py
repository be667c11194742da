"""Program bundles: .tar.gz or .zip archives stored once per sha256 digest."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.orm import Session

from mwms.archive import ArchiveError, ArchiveLimits, UnsupportedArchiveError, inspect_archive
from mwms.server.db.models import Bundle
from mwms.server.errors import InvalidInput, NotFound
from mwms.server.services.storage import shared_files
from mwms.server.services.storage.uploads import UploadSpool

CHUNK = 1024 * 1024


def check_bundle(spool: UploadSpool, limits: ArchiveLimits) -> tuple[Path, str, int, str]:
    """Closes a received upload and checks it is an archive with files, within `limits`.

    Returns (temp path, digest, size, format). Raises InvalidInput (and removes the file) for empty,
    non-archive, damaged or oversized archives, bombs, and archives with no files in them. CPU-bound and
    bounded by `limits`: run it in the archive workers' pool.
    """
    try:
        path, digest, size = spool.finish()
        if size == 0:
            raise InvalidInput("the bundle is empty: upload a .tar.gz or .zip of your program's directory")
        try:
            summary = inspect_archive(path, limits)
        except UnsupportedArchiveError:
            raise InvalidInput(
                "the bundle is not a .tar.gz or .zip archive: pack your program directory"
            ) from None
        except ArchiveError as error:
            raise InvalidInput(f"the bundle was refused: {error}") from None
        if summary.files == 0:
            raise InvalidInput("the bundle holds no files: pack the directory that contains your program")
        return path, digest, size, summary.format
    except BaseException:
        spool.discard()
        raise


def share_bundle(db: shared_files.Bind, bundle_dir: Path, spooled: Path, digest: str) -> None:
    """Stores a checked upload in the database under its digest, so that every replica can serve it once
    `record_bundle` records it (a no-op on SQLite, and when that content is shared already). Copies the
    file: run it in the archive workers' pool, outside any transaction."""
    shared_files.publish(
        db, bundle_dir.parent, _shared_name(bundle_dir, digest), source=spooled, sha256=digest
    )


def _shared_name(bundle_dir: Path, digest: str) -> str:
    return shared_files.shared_name(bundle_dir.parent, bundle_dir / digest)


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
    """The stored archive of `digest`; NotFound when it was never uploaded. A replica that lacks the file
    writes it from the shared copy first (server/services/storage/shared_files.py)."""
    if session.get(Bundle, digest) is None or not shared_files.materialize(
        session, bundle_dir.parent, _shared_name(bundle_dir, digest)
    ):
        raise NotFound(f"no bundle with digest {digest}; upload it with POST /api/v1/bundles first")
    return bundle_dir / digest
