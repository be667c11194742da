"""The one place job and task states change: checked against the tables, recorded with time and reason."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from server.db.models import Job, JobEvent, Task, utcnow
from server.observability.instruments import observe_job_transition
from server.states import JobState, TaskState, check_job_transition, check_task_transition


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
    session.flush()
