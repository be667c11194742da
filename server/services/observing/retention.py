"""Retention: log lines and metric points of jobs that finished long ago are deleted in bounded batches.

MWMS_TELEMETRY_RETENTION_DAYS says how long; 0 keeps them forever. The jobs themselves, their attempts,
tasks, events and files are kept: the jobs list and `mwms jobs` still show them, without step and loss.
Each batch is one short write transaction (at most BATCH_ROWS rows of each table, from at most
JOBS_PER_BATCH jobs), so the purge never holds the writer for long; the caller pauses between batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, LogLine, MetricPoint, utcnow
from mwms.server.states import JobState

BATCH_ROWS = 5000
JOBS_PER_BATCH = 200
FINISHED = [s.value for s in JobState if s.terminal]


@dataclass
class PurgeCursor:
    """How far the purge has come: jobs finished up to (finished_at, job_id) have nothing left to delete."""

    finished_at: datetime | None = None
    job_id: str = ""


@dataclass(frozen=True)
class BatchOutcome:
    log_lines: int
    metric_points: int
    more: bool  # another batch may find something to delete


def cutoff(retention_days: float, now: datetime | None = None) -> datetime | None:
    """Jobs that finished before this have their telemetry deleted; None when retention is off (0 days)."""
    if retention_days <= 0:
        return None
    return (now or utcnow()) - timedelta(days=retention_days)


def _old_jobs(
    session: Session, before: datetime, cursor: PurgeCursor, limit: int
) -> list[tuple[str, datetime]]:
    query = select(Job.id, Job.finished_at).where(
        Job.finished_at.is_not(None), Job.finished_at < before, Job.state.in_(FINISHED)
    )
    if cursor.finished_at is not None:
        query = query.where(
            or_(
                Job.finished_at > cursor.finished_at,
                and_(Job.finished_at == cursor.finished_at, Job.id > cursor.job_id),
            )
        )
    rows = session.execute(query.order_by(Job.finished_at, Job.id).limit(limit)).all()
    return [(job_id, finished) for job_id, finished in rows if finished is not None]


def _delete_some(
    session: Session, model: type[LogLine] | type[MetricPoint], job_ids: list[str], rows: int
) -> int:
    doomed = select(model.id).where(model.job_id.in_(job_ids)).limit(rows).scalar_subquery()
    result = session.execute(
        delete(model).where(model.id.in_(doomed)).execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def purge_batch(
    session: Session,
    before: datetime,
    cursor: PurgeCursor,
    *,
    max_rows: int = BATCH_ROWS,
    max_jobs: int = JOBS_PER_BATCH,
) -> BatchOutcome:
    """Deletes up to `max_rows` log lines and `max_rows` metric points of jobs that finished before
    `before`, starting after `cursor`; moves the cursor past jobs that have nothing left."""
    jobs = _old_jobs(session, before, cursor, max_jobs)
    if not jobs:
        return BatchOutcome(0, 0, more=False)
    job_ids = [job_id for job_id, _ in jobs]
    lines = _delete_some(session, LogLine, job_ids, max_rows)
    points = _delete_some(session, MetricPoint, job_ids, max_rows)
    if lines < max_rows and points < max_rows:  # these jobs are empty now: go on after them
        cursor.job_id, cursor.finished_at = job_ids[-1], jobs[-1][1]
    return BatchOutcome(lines, points, more=True)
