"""Log lines and metric points read back for users: a job's log lines, a page of its metric points, and its
progress (latest step and loss), as columns of a query of jobs or on its own.

Stored by services/observing/telemetry.py; a metric value comes back as the API shows it (value_out): NaN,
stored as NULL, as "NaN".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, ScalarSelect, Select, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session, aliased

from mwms import metrics_line
from mwms.server.db.models import Job, LogLine, MetricPoint, Task

# Metric points one read returns at most (GET /jobs/{id}/metrics pages beyond it).
MAX_METRIC_POINTS_PER_PAGE = 10_000
# Characters of log text one read returns at most, whatever the lines asked for: a line holds up to 64 KiB
# (worker_agent/output_lines.py), and 10,000 of them cost the coordinator 1.4 GiB for one request. A page
# within it holds fewer lines than asked; the cursor goes on from there.
MAX_LOG_PAGE_CHARS = 8 * 1024 * 1024
# Rows fetched at a time while a page fills (a server-side cursor on PostgreSQL): what is read past the
# budget is at most this many lines.
_LOG_ROWS_PER_FETCH = 64


def value_out(stored: float | None) -> float | metrics_line.NonFinite:
    """A stored metric value as the API shows it: a number, or "NaN" / "Infinity" / "-Infinity"."""
    return metrics_line.json_value(math.nan if stored is None else stored)


def read_logs(
    session: Session,
    job: Job,
    *,
    task_index: int | None,
    attempt: int | None,
    after: int,
    tail: int,
    superseded: bool = True,
    max_chars: int = MAX_LOG_PAGE_CHARS,
) -> list[tuple[LogLine, Task]]:
    """Log lines of a job in arrival order; `after` is a cursor (line id), `tail` keeps the newest N;
    `superseded=False` leaves out the lines a newer state (a redraw) replaced. At most `max_chars` of text
    (but always a line): the first lines after the cursor, or the newest, that fit."""
    query = select(LogLine, Task).join(Task, Task.id == LogLine.task_id).where(LogLine.job_id == job.id)
    if not superseded:
        query = query.where(LogLine.superseded.is_(False))
    if task_index is not None:
        query = query.where(Task.index == task_index)
    if attempt is not None:
        query = query.where(Task.attempt_number == attempt)
    if after:
        query = query.where(LogLine.id > after).order_by(LogLine.id)
    else:
        query = query.order_by(LogLine.id.desc())
    rows = _within(session, query.limit(tail), max_chars)
    return rows if after else rows[::-1]


def _within(session: Session, query: Select[LogLine, Task], max_chars: int) -> list[tuple[LogLine, Task]]:
    """The rows of `query` in its order up to `max_chars` of text, at least one; the rest is not fetched."""
    result = session.execute(query.execution_options(yield_per=_LOG_ROWS_PER_FETCH))
    rows: list[tuple[LogLine, Task]] = []
    chars = 0
    try:
        for line, task in result.tuples():
            chars += len(line.text)
            if rows and chars > max_chars:
                break
            rows.append((line, task))
    finally:
        result.close()
    return rows


def read_metrics(
    session: Session,
    job: Job,
    *,
    name: str | None,
    min_step: int | None,
    max_step: int | None,
    attempt: int | None,
    after: int | None = None,
    limit: int = MAX_METRIC_POINTS_PER_PAGE,
) -> tuple[list[MetricPoint], bool]:
    """A page of a job's metric points and whether more match: at most `limit`, ordered by name,
    attempt and step; or, `after` a cursor (a point's id), only the points stored after it, in storage
    order, so a page that polls reads only what is new."""
    query = select(MetricPoint).where(MetricPoint.job_id == job.id)
    if after is not None:
        query = query.where(MetricPoint.id > after)
    if name:
        query = query.where(MetricPoint.name == name)
    if min_step is not None:
        query = query.where(MetricPoint.step >= min_step)
    if max_step is not None:
        query = query.where(MetricPoint.step <= max_step)
    if attempt is not None:
        query = query.where(MetricPoint.attempt == attempt)
    order: tuple[Any, ...] = (MetricPoint.id,)
    if after is None:
        order = (MetricPoint.name, MetricPoint.attempt, MetricPoint.step, MetricPoint.id)
    points = list(session.scalars(query.order_by(*order).limit(limit + 1)).all())
    return points[:limit], len(points) > limit


@dataclass(frozen=True)
class ProgressColumns:
    """Correlated scalar subqueries for a job's progress, so a page of jobs reads it in its own query."""

    step: ScalarSelect[Any]
    loss_id: ScalarSelect[Any]
    loss_value: ScalarSelect[Any]

    def all(self) -> tuple[ScalarSelect[Any], ScalarSelect[Any], ScalarSelect[Any]]:
        return self.step, self.loss_id, self.loss_value


Progress = tuple[int | None, float | metrics_line.NonFinite | None]


def progress_columns(job_id: ColumnElement[str] | InstrumentedAttribute[str] | str) -> ProgressColumns:
    """(latest step, latest loss) of the job `job_id` (a value, or a column such as Job.id) as subqueries.

    Each is a seek on ix_metric_points_job_attempt_step: the newest attempt that reported anything is its
    max(attempt), the latest step the first non-epoch point walking back from its highest step.
    """
    reported = aliased(MetricPoint)
    # Nested subqueries correlate to the outer jobs row explicitly (auto-correlation reaches one level).
    newest = (
        select(func.max(reported.attempt))
        .where(reported.job_id == job_id)
        .correlate_except(reported)
        .scalar_subquery()
    )
    of_newest = (MetricPoint.job_id == job_id, MetricPoint.attempt == newest)
    step = (
        select(MetricPoint.step)
        .where(*of_newest, ~MetricPoint.name.startswith("epoch_"))
        .order_by(MetricPoint.step.desc())
        .limit(1)
        .correlate_except(MetricPoint)
        .scalar_subquery()
    )
    loss_id = (
        select(MetricPoint.id)
        .where(*of_newest, MetricPoint.name == "loss")
        .order_by(MetricPoint.step.desc(), MetricPoint.id.desc())
        .limit(1)
        .correlate_except(MetricPoint)
        .scalar_subquery()
    )
    # A NaN loss is stored as NULL: the id tells "no loss reported" from "the loss was NaN".
    loss_point = aliased(MetricPoint)
    loss_value = (
        select(loss_point.value)
        .where(loss_point.id == loss_id)
        .correlate_except(loss_point)
        .scalar_subquery()
    )
    return ProgressColumns(step, loss_id, loss_value)


def progress_out(step: int | None, loss_id: int | None, loss_value: float | None) -> Progress:
    """The values of `progress_columns` as the API shows them (the loss through `value_out`)."""
    return step, (value_out(loss_value) if loss_id is not None else None)


def latest_progress(session: Session, job: Job) -> Progress:
    """(latest step, latest loss) reported by the job's newest attempt that reported anything.

    The loss is as the API shows it (`value_out`): a number or "NaN"/"Infinity"/"-Infinity"; None when
    no loss was reported. One query.
    """
    step, loss_id, loss_value = session.execute(select(*progress_columns(job.id).all())).one()
    return progress_out(step, loss_id, loss_value)
