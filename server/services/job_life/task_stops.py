"""Asking a job's tasks to stop: the job's current attempt, the grace every stop of its tasks gets (the job's
preemption_grace_seconds, else the coordinator's MWMS_STOP_GRACE_S), the request that the task's agent acts
on, and whether that agent is gone (then no report will end the task).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, Task
from mwms.server.states import TaskState


def current_attempt(job: Job) -> Attempt | None:
    """The job's latest attempt, None before its first placement."""
    return job.attempts[-1] if job.attempts else None


def stop_grace_for(job: Job) -> int | None:
    """The SIGTERM-to-SIGKILL grace the job asked for (preemption_grace_seconds), which every stop of its
    tasks gets; None: the coordinator's MWMS_STOP_GRACE_S (1 s by default, so a cancel or a restart is
    prompt even for a program that catches SIGTERM, as TensorFlow does)."""
    grace = job.options.get("preemption_grace_seconds") if isinstance(job.options, dict) else None
    return grace if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0 else None


def request_stop(task: Task, reason: str, grace_s: int | None = None) -> None:
    """Asks the task's agent to stop it (with `grace_s` before SIGKILL when given); the agent's report
    ends the task."""
    if not TaskState(task.state).terminal and not task.stop_requested:
        task.stop_requested = True
        task.stop_reason = reason
        if grace_s is not None and task.stop_grace_s is None:
            task.stop_grace_s = grace_s


def agent_is_gone(session: Session, task: Task) -> bool:
    agent = session.get(Agent, task.agent_id)
    return agent is None or agent.lost_at is not None
