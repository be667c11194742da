"""Files the coordinator keeps per job: the chief's artifacts and the latest checkpoint archive."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from mwms.archive import ArchiveError, ArchiveLimits, archive_format, extract_archive, inspect_archive
from mwms.server.db.models import Attempt, Job, StoredFile, Task
from mwms.server.errors import Conflict, InvalidInput, NotFound
from mwms.server.services.storage import shared_files

ARTIFACT = "artifact"
CHECKPOINT = "checkpoint"


def artifact_root(files_dir: Path, job_id: str, attempt: int) -> Path:
    return files_dir / job_id / "artifacts" / f"attempt-{attempt}"


def checkpoint_archive(files_dir: Path, job_id: str) -> Path:
    return files_dir / job_id / "checkpoint.tar.gz"


def unpack_artifacts(
    files_dir: Path, task: Task, archive: Path, limits: ArchiveLimits
) -> list[tuple[str, int, str]]:
    """Extracts an uploaded artifacts archive within `limits` (no database work); returns (path, size, sha256)
    per file. InvalidInput, with nothing left behind, when the archive is refused."""
    root = artifact_root(files_dir, task.job_id, task.attempt_number)
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        extract_archive(archive, staging, limits)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty_parents(staging, files_dir)
        if isinstance(error, ArchiveError):
            raise InvalidInput(f"the artifacts archive of task {task.id} was refused: {error}") from None
        raise
    shutil.rmtree(root, ignore_errors=True)
    os.replace(staging, root)
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        found.append((path.relative_to(root).as_posix(), path.stat().st_size, file_sha256(path)))
    return found


def share_artifacts(
    db: shared_files.Bind, files_dir: Path, task: Task, found: list[tuple[str, int, str]]
) -> None:
    """Stores the attempt's unpacked artifacts (`unpack_artifacts`' answer) in the database, so that every
    replica can serve them, and forgets shared files the attempt no longer has; a no-op on SQLite. Copies
    the files: run it in the archive workers' pool, outside any transaction, before `record_artifacts`."""
    root = artifact_root(files_dir, task.job_id, task.attempt_number)
    shared_files.publish_tree(
        db, files_dir.parent, shared_files.shared_name(files_dir.parent, root), [(p, d) for p, _, d in found]
    )


def _remove_empty_parents(path: Path, top: Path) -> None:
    """Removes the directories between `path` and `top` that are empty (a refused upload leaves none)."""
    for parent in path.parents:
        if parent == top or top not in parent.parents:
            return
        try:
            parent.rmdir()
        except OSError:  # not empty: earlier attempts' files live there
            return


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in chunks (never the whole file in memory)."""
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def check_checkpoint(archive: Path, task: Task, limits: ArchiveLimits) -> None:
    """Refuses (InvalidInput) a checkpoint archive the agents would refuse to restore: not a tar.gz, or over
    `limits`. CPU-bound and bounded by `limits`: run it in the archive workers' pool."""
    try:
        if archive_format(archive) != "tar.gz":
            raise InvalidInput(f"the checkpoint of task {task.id} is not a tar.gz archive")
        inspect_archive(archive, limits)
    except ArchiveError as error:
        raise InvalidInput(f"the checkpoint archive of task {task.id} was refused: {error}") from None


def record_artifacts(session: Session, task: Task, files: list[tuple[str, int, str]]) -> None:
    """Replaces the artifact records of the task's attempt with `files`."""
    session.execute(
        delete(StoredFile).where(
            StoredFile.job_id == task.job_id,
            StoredFile.kind == ARTIFACT,
            StoredFile.attempt == task.attempt_number,
        )
    )
    for path, size, digest in files:
        session.add(
            StoredFile(
                job_id=task.job_id,
                kind=ARTIFACT,
                attempt=task.attempt_number,
                path=path,
                size=size,
                sha256=digest,
            )
        )
    session.flush()


def ensure_current_attempt(session: Session, task: Task) -> None:
    """Refuses a checkpoint from a task of an older attempt: it would replace a newer checkpoint."""
    newest = session.scalar(select(func.max(Attempt.number)).where(Attempt.job_id == task.job_id))
    if newest is not None and task.attempt_number < newest:
        raise Conflict(
            f"checkpoint from attempt {task.attempt_number} of job {task.job_id} ignored: attempt {newest} is newer"
        )


def install_checkpoint(files_dir: Path, task: Task, archive: Path) -> None:
    """Makes an uploaded (and checked) checkpoint archive the job's latest one."""
    target = checkpoint_archive(files_dir, task.job_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(archive, target)


def share_checkpoint(db: shared_files.Bind, files_dir: Path, task: Task, archive: Path, digest: str) -> None:
    """Stores a checked checkpoint archive in the database as the job's latest (replacing the one before),
    so that every replica can serve it; a no-op on SQLite. Run it before `install_checkpoint` (a local copy
    is then never newer than the shared one), in the archive workers' pool, outside any transaction."""
    target = checkpoint_archive(files_dir, task.job_id)
    shared_files.publish(
        db,
        files_dir.parent,
        shared_files.shared_name(files_dir.parent, target),
        source=archive,
        sha256=digest,
    )


def latest_checkpoint(session: Session, files_dir: Path, job_id: str) -> Path | None:
    """The job's latest checkpoint archive, None when it has none. A replica whose copy is missing or older
    than the shared one writes it from the shared copy first."""
    path = checkpoint_archive(files_dir, job_id)
    fresh = shared_files.materialize(
        session, files_dir.parent, shared_files.shared_name(files_dir.parent, path), fresh=True
    )
    return path if fresh and path.is_file() else None


def record_checkpoint(session: Session, task: Task, size: int, digest: str) -> None:
    session.execute(delete(StoredFile).where(StoredFile.job_id == task.job_id, StoredFile.kind == CHECKPOINT))
    session.add(
        StoredFile(
            job_id=task.job_id,
            kind=CHECKPOINT,
            attempt=task.attempt_number,
            path="checkpoint.tar.gz",
            size=size,
            sha256=digest,
        )
    )
    session.flush()


def list_artifacts(session: Session, job: Job) -> list[StoredFile]:
    return list(
        session.scalars(
            select(StoredFile)
            .where(StoredFile.job_id == job.id, StoredFile.kind == ARTIFACT)
            .order_by(StoredFile.attempt.desc(), StoredFile.path)
        ).all()
    )


def artifact_file(session: Session, files_dir: Path, job: Job, path: str, attempt: int | None) -> Path:
    """The stored file for `path` (newest attempt unless given); NotFound otherwise."""
    if ".." in Path(path).parts or path.startswith("/"):
        raise InvalidInput(f"artifact path {path!r} must be relative and must not contain '..'")
    query = select(StoredFile).where(
        StoredFile.job_id == job.id, StoredFile.kind == ARTIFACT, StoredFile.path == path
    )
    if attempt is not None:
        query = query.where(StoredFile.attempt == attempt)
    record = session.scalars(query.order_by(StoredFile.attempt.desc()).limit(1)).first()
    if record is None:
        raise NotFound(
            f"job {job.id} has no artifact {path!r}; list them with GET /api/v1/jobs/{job.id}/artifacts"
        )
    location = artifact_root(files_dir, job.id, record.attempt) / record.path
    # A replica that lacks the file writes it from the shared copy (server/services/storage/shared_files.py).
    shared_files.materialize(session, files_dir.parent, shared_files.shared_name(files_dir.parent, location))
    return location
