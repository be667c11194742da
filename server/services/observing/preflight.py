"""Preflight checks of a job's gang: whether a job runs one, and the results its tasks report.

The check itself runs on the agents (worker_agent/preflight.py, mwms_runtime/preflight.py). A failed check
ends its task FAILED with the check's message, which names both workers and the address; the attempt then
ends like any task failure (server/services/job_life/tasks.py). The rule for restarts is the exit code's: the
check exits with a code in 1-127, so a failed check is permanent unless the job's restart_on is "any".
Placement does not know the network, so placing the gang again would most often pick the same hosts and
fail the same way; the message says what to fix instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, PreflightResult, Task
from mwms.server.errors import NotFound

MAX_MESSAGE_CHARS = 2000


@dataclass(frozen=True)
class IncomingPreflight:
    """One PreflightResult as an agent sent it."""

    task_id: str
    ok: bool
    message: str
    report: dict[str, Any] = field(default_factory=dict)


def preflight_wanted(job: Job, default: bool) -> bool:
    """Whether the job's tasks run the check: the job's choice, else `default`; never for a single worker."""
    value = job.options.get("preflight")
    wanted = default if value is None else bool(value)
    return wanted and job.num_workers > 1


def allreduce_wanted(job: Job, default: bool) -> bool:
    """Whether the check includes its all-reduce phase: always when the job itself asked for the check."""
    return default or job.options.get("preflight") is True


def store_result(session: Session, agent_id: str, result: IncomingPreflight) -> bool:
    """Stores a task's result once (a resent one changes nothing); False for a task not on this agent."""
    task = session.get(Task, result.task_id)
    if task is None or task.agent_id != agent_id:
        return False
    if session.scalar(select(PreflightResult.id).where(PreflightResult.task_id == task.id)) is not None:
        return False
    session.add(
        PreflightResult(
            job_id=task.job_id,
            task_id=task.id,
            attempt=task.attempt_number,
            task_index=task.index,
            ok=result.ok,
            message=result.message[:MAX_MESSAGE_CHARS],
            report=result.report,
        )
    )
    session.flush()
    return True


def list_results(session: Session, job_id: str) -> list[PreflightResult]:
    """The job's preflight results by attempt, then task index (NotFound for an unknown job)."""
    if session.get(Job, job_id) is None:
        raise NotFound(f"no job with id {job_id}; list jobs with GET /api/v1/jobs or `mwms jobs`")
    return list(
        session.scalars(
            select(PreflightResult)
            .where(PreflightResult.job_id == job_id)
            .order_by(PreflightResult.attempt, PreflightResult.task_index)
        ).all()
    )
