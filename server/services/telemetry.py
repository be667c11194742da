"""Log lines and metric points from agents: stored once per (task, seq), read back for users."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from server.db.models import Job, LogLine, MetricPoint, Task


@dataclass(frozen=True)
class IncomingLine:
    seq: int
    stream: str
    text: str
    unix_ms: int


@dataclass(frozen=True)
class IncomingPoint:
    seq: int
    name: str
    step: int
    value: float
    unix_ms: int


def _from_ms(unix_ms: int) -> datetime:
    return datetime.fromtimestamp(unix_ms / 1000, tz=timezone.utc)


def _insert_ignoring_duplicates(session: Session, model: type, rows: list[dict]) -> None:
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    session.execute(insert(model).values(rows).on_conflict_do_nothing())  # type: ignore[attr-defined]


def store_log_lines(session: Session, task: Task, lines: list[IncomingLine]) -> int:
    """Stores lines not stored before; returns the highest seq now acknowledged."""
    rows = [
        {
            "job_id": task.job_id,
            "task_id": task.id,
            "seq": line.seq,
            "stream": line.stream[:10],
            "text": line.text,
            "at": _from_ms(line.unix_ms),
        }
        for line in lines
    ]
    _insert_ignoring_duplicates(session, LogLine, rows)
    return max((line.seq for line in lines), default=0)


def store_metric_points(session: Session, task: Task, points: list[IncomingPoint]) -> int:
    """Stores points not stored before; returns the highest seq now acknowledged."""
    rows = [
        {
            "job_id": task.job_id,
            "task_id": task.id,
            "attempt": task.attempt_number,
            "seq": p.seq,
            "name": p.name[:200],
            "step": p.step,
            "value": p.value,
            "wall_time": _from_ms(p.unix_ms),
        }
        for p in points
    ]
    _insert_ignoring_duplicates(session, MetricPoint, rows)
    return max((p.seq for p in points), default=0)


def read_logs(
    session: Session, job: Job, *, task_index: int | None, attempt: int | None, after: int, tail: int
) -> list[tuple[LogLine, Task]]:
    """Log lines of a job in arrival order; `after` is a cursor (line id), `tail` keeps the newest N."""
    query = select(LogLine, Task).join(Task, Task.id == LogLine.task_id).where(LogLine.job_id == job.id)
    if task_index is not None:
        query = query.where(Task.index == task_index)
    if attempt is not None:
        query = query.where(Task.attempt_number == attempt)
    if after:
        query = query.where(LogLine.id > after)
        rows = session.execute(query.order_by(LogLine.id).limit(tail)).all()
        return [(line, task) for line, task in rows]
    rows = session.execute(query.order_by(LogLine.id.desc()).limit(tail)).all()
    return [(line, task) for line, task in reversed(rows)]


def read_metrics(
    session: Session,
    job: Job,
    *,
    name: str | None,
    min_step: int | None,
    max_step: int | None,
    attempt: int | None,
) -> list[MetricPoint]:
    """A job's metric series ordered by name, attempt and step."""
    query = select(MetricPoint).where(MetricPoint.job_id == job.id)
    if name:
        query = query.where(MetricPoint.name == name)
    if min_step is not None:
        query = query.where(MetricPoint.step >= min_step)
    if max_step is not None:
        query = query.where(MetricPoint.step <= max_step)
    if attempt is not None:
        query = query.where(MetricPoint.attempt == attempt)
    return list(
        session.scalars(
            query.order_by(MetricPoint.name, MetricPoint.attempt, MetricPoint.step, MetricPoint.id)
        ).all()
    )


def latest_progress(session: Session, job: Job) -> tuple[int | None, float | None]:
    """(latest step, latest loss) reported by the job's newest attempt that reported anything."""
    newest = session.scalar(select(func.max(MetricPoint.attempt)).where(MetricPoint.job_id == job.id))
    if newest is None:
        return None, None
    step = session.scalar(
        select(func.max(MetricPoint.step)).where(
            MetricPoint.job_id == job.id,
            MetricPoint.attempt == newest,
            ~MetricPoint.name.startswith("epoch_"),
        )
    )
    loss = session.scalar(
        select(MetricPoint.value)
        .where(MetricPoint.job_id == job.id, MetricPoint.attempt == newest, MetricPoint.name == "loss")
        .order_by(MetricPoint.step.desc(), MetricPoint.id.desc())
        .limit(1)
    )
    return step, loss
