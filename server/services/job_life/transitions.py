"""The one place job, attempt and task states change: checked against the tables (server/states.py).

Job and attempt changes are recorded as events (job_events, attempt_events) with time and reason; an
attempt's ending also with its cause and what acted on it (server/services/job_life/attempt_endings.py).
Which change to make is decided in server/services/job_life/lifecycle.py; this module only applies it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from mwms.server.db.models import Attempt, AttemptEvent, Job, JobEvent, Task, utcnow
from mwms.server.observability.event_log import log_after_commit, reason_summary
from mwms.server.observability.instruments import observe_job_transition
from mwms.server.services.job_life.attempt_endings import AttemptEnding
from mwms.server.services.scheduler import device_claims
from mwms.server.states import (
    DEVICE_HOLDING_TASK_STATES,
    AttemptState,
    JobState,
    TaskState,
    check_attempt_transition,
    check_job_transition,
    check_task_transition,
)


def transition_job(
    session: Session, job: Job, to: JobState, reason: str = "", now: datetime | None = None
) -> None:
    """Moves `job` to `to`, recording an event; raises InvalidTransition when the table forbids it."""
    now = now or utcnow()
    current = JobState(job.state) if job.state else None
    check_job_transition(current, to)
    job.state = to.value
    job.reason = reason
    if to == JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if to.terminal:
        job.finished_at = now
    observe_job_transition(session, job, current, to, now)  # counted once committed
    summary = reason_summary(reason)
    log_after_commit(
        session,
        f"job {job.id}: {current.value if current else 'new'} -> {to.value}"
        + (f": {summary}" if summary else ""),
        event="job_state",
        job_id=job.id,
        state=to.value,
        from_state=current.value if current else None,
        reason=summary,
    )
    session.add(
        JobEvent(
            job_id=job.id,
            from_state=current.value if current else None,
            to_state=to.value,
            reason=reason,
            at=now,
        )
    )
    session.flush()


def transition_attempt(
    session: Session,
    attempt: Attempt,
    to: AttemptState,
    reason: str = "",
    now: datetime | None = None,
    ending: AttemptEnding | None = None,
) -> None:
    """Moves `attempt` to `to`, recording an event; raises InvalidTransition when the table forbids it.

    A new attempt (state "") becomes ACTIVE here; it must have been flushed so that it has an id. An
    ending (to a final state) carries `ending`, why it ended and what acted on it, stored on its event.
    """
    now = now or utcnow()
    current = AttemptState(attempt.state) if attempt.state else None
    check_attempt_transition(current, to)
    attempt.state = to.value
    if to.terminal:
        attempt.reason = reason
        attempt.ended_at = now
    summary = reason_summary(reason)
    log_after_commit(
        session,
        f"job {attempt.job_id} attempt {attempt.number}: {current.value if current else 'new'} -> {to.value}"
        + (f": {summary}" if summary else ""),
        event="attempt_state",
        job_id=attempt.job_id,
        attempt=attempt.number,
        attempt_id=attempt.id,
        state=to.value,
        from_state=current.value if current else None,
        reason=summary,
        cause=ending.kind if ending is not None else None,
    )
    session.add(
        AttemptEvent(
            attempt_id=attempt.id,
            from_state=current.value if current else None,
            to_state=to.value,
            reason=reason,
            at=now,
            cause=ending.kind if ending is not None else "",
            details=dict(ending.details) if ending is not None else {},
        )
    )
    session.flush()


def transition_task(
    session: Session, task: Task, to: TaskState, message: str = "", now: datetime | None = None
) -> None:
    """Moves `task` to `to`; raises InvalidTransition when the table forbids it."""
    now = now or utcnow()
    check_task_transition(TaskState(task.state), to)
    task.state = to.value
    if message:
        task.message = message
    if to == TaskState.RUNNING and task.started_at is None:
        task.started_at = now
    if to.terminal:
        task.ended_at = now
    if to.value not in DEVICE_HOLDING_TASK_STATES:
        device_claims.release(session, task)
    session.flush()
