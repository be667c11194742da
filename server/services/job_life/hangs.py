"""Hang detection's database side: the attempts it watches, and what it does to one found hung.

A RUNNING job's active attempt is hung when none of its tasks produced a log line or metric point for
the job's hang timeout (server/live/hang_detector.py keeps the clock). The attempt then ends as a retryable
failure through the same path as a lost agent (services.job_life.lifecycle.fail_attempt): restarted while restarts
remain, else the job fails; the reason names the workers that do not wait in a collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, or_, select, update
from sqlalchemy.orm import Session

from mwms.server.db.models import Attempt, Job, Task, utcnow
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.jobs import NEVER_S
from mwms.server.services.job_life.lifecycle import fail_attempt
from mwms.server.services.observing.stacks import describe_workers_outside_collectives
from mwms.server.states import AttemptState, JobState

OPTION = "hang_timeout_seconds"


@dataclass(frozen=True)
class WatchedTask:
    task_id: str
    started_at: datetime | None
    # The last progress any replica stored for it (flushed about every second: record_progress).
    progress_at: datetime | None = None


@dataclass(frozen=True)
class WatchedAttempt:
    """A RUNNING job's active attempt, with the hang timeout that applies to it (None: not watched)."""

    job_id: str
    attempt_id: str
    attempt: int
    timeout_s: float | None
    tasks: list[WatchedTask]


def hang_timeout(options: dict[str, Any], default_s: float) -> float | None:
    """The job's hang timeout in seconds (its option, else the coordinator's default); None: off.

    0, a value that is no finite positive number (a damaged row) and anything past NEVER_S are off.
    """
    value = options.get(OPTION)
    if value is None:
        value = default_s
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value) if 0 < value <= NEVER_S else None


def running_attempts(session: Session, default_timeout_s: float) -> list[WatchedAttempt]:
    """Every RUNNING job's active attempt with its tasks, in two queries of plain columns (no ORM objects:
    the detector reads every few seconds, in the coordinator that also answers heartbeats)."""
    running = (Job.state == JobState.RUNNING.value, Attempt.state == AttemptState.ACTIVE.value)
    attempts = session.execute(
        select(Job.id, Job.options, Attempt.id, Attempt.number)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(*running)
    ).all()
    tasks: dict[str, list[WatchedTask]] = {}
    for attempt_id, task_id, started_at, progress_at in session.execute(
        select(Task.attempt_id, Task.id, Task.started_at, Task.progress_at)
        .join(Attempt, Attempt.id == Task.attempt_id)
        .join(Job, Job.id == Attempt.job_id)
        .where(*running)
        .order_by(Task.attempt_id, Task.index)
    ):
        tasks.setdefault(attempt_id, []).append(WatchedTask(task_id, started_at, progress_at))
    return [
        WatchedAttempt(
            job_id=job_id,
            attempt_id=attempt_id,
            attempt=number,
            timeout_s=hang_timeout(options or {}, default_timeout_s),
            tasks=tasks.get(attempt_id, []),
        )
        for job_id, options, attempt_id, number in attempts
    ]


def record_progress(session: Session, seen: dict[str, datetime]) -> None:
    """Writes when each task last made progress on this replica, in one statement; never backwards."""
    if not seen:
        return
    table = Task.__table__
    assert isinstance(table, Table)
    statement = (
        update(table)
        .where(
            table.c.id == bindparam("task_id"),
            or_(table.c.progress_at.is_(None), table.c.progress_at < bindparam("at")),
        )
        .values(progress_at=bindparam("at"))
    )
    session.connection().execute(statement, [{"task_id": t, "at": at} for t, at in sorted(seen.items())])


def act_on_hang(
    session: Session,
    job_id: str,
    attempt_id: str,
    timeout_s: float,
    stack_request_id: str | None,
    *,
    backoff_base_s: float,
    now: datetime | None = None,
) -> str | None:
    """Ends a hung attempt as a retryable failure; returns the reason, or None when the attempt had
    already ended (or the job left RUNNING) meanwhile."""
    now = now or utcnow()
    job = session.get(Job, job_id)
    attempt = session.get(Attempt, attempt_id)
    if (
        job is None
        or attempt is None
        or attempt.job_id != job.id
        or job.state != JobState.RUNNING.value
        or attempt.state != AttemptState.ACTIVE.value
    ):
        return None
    where = (
        describe_workers_outside_collectives(session, stack_request_id)
        if stack_request_id
        else "no stacks could be taken"
    )
    reason = f"no progress for {timeout_s:g} s (no log line or metric point from any worker); {where}"
    fail_attempt(
        session,
        job,
        attempt,
        reason,
        retryable=True,
        backoff_base_s=backoff_base_s,
        now=now,
        cause="hang",
        ending=attempt_endings.hang(timeout_s),
    )
    return reason
