"""Files the coordinator keeps per job: the chief's artifacts and the latest checkpoint archive."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from mwms.archive import extract_archive
from server.db.models import Attempt, Job, StoredFile, Task
from server.errors import Conflict, InvalidInput, NotFound

ARTIFACT = "artifact"
CHECKPOINT = "checkpoint"


def artifact_root(files_dir: Path, job_id: str, attempt: int) -> Path:
    return files_dir / job_id / "artifacts" / f"attempt-{attempt}"


def checkpoint_archive(files_dir: Path, job_id: str) -> Path:
    return files_dir / job_id / "checkpoint.tar.gz"


def unpack_artifacts(files_dir: Path, task: Task, archive: Path) -> list[tuple[str, int, str]]:
    """Extracts an uploaded artifacts archive (no database work); returns (path, size, sha256) per file."""
    root = artifact_root(files_dir, task.job_id, task.attempt_number)
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    extract_archive(archive, staging)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(staging, root)
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        found.append((path.relative_to(root).as_posix(), path.stat().st_size, digest))
    return found


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


def install_checkpoint(files_dir: Path, task: Task, archive: Path) -> tuple[int, str]:
    """Makes an uploaded checkpoint archive the job's latest one; returns (size, sha256)."""
    target = checkpoint_archive(files_dir, task.job_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    size = archive.stat().st_size
    os.replace(archive, target)
    return size, digest


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
    return artifact_root(files_dir, job.id, record.attempt) / record.path
