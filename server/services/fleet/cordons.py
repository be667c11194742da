"""Cordons and drains: an admin takes an agent out of placement, and optionally moves its jobs elsewhere.

A cordoned agent keeps what it runs but is given nothing new (the scheduler skips it). A drain cordons the
agent and preempts, gracefully, every job that has a live task on it (cause "drain", server/services/
lifecycle.py): those jobs wait again in their place and are placed on other agents. With `let_finish` the
jobs run to their end instead. The agent counts as drained once it is draining and holds no task.
Uncordoning ends both. Who did it, when and why are kept on the agent row, so they outlive a restart.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Job, Task, utcnow
from mwms.server.errors import Conflict, InvalidInput
from mwms.server.limits import LimitExceeded
from mwms.server.schemas import MAX_CORDON_REASON_CHARS
from mwms.server.services.fleet.agent_references import find_agent
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.lifecycle import preempt_job
from mwms.server.states import JobState, TaskState

_LIVE_TASK_STATES = [state.value for state in TaskState if not state.terminal]
_PREEMPTIBLE_JOB_STATES = (JobState.SCHEDULED.value, JobState.RUNNING.value)


def check_reason(reason: str) -> str:
    """A cordon or drain reason as stored (stripped), or InvalidInput saying what a valid one looks like."""
    text = reason.strip()
    if len(text) > MAX_CORDON_REASON_CHARS or not text.isprintable():
        raise InvalidInput(
            f"reason must be at most {MAX_CORDON_REASON_CHARS} printable characters (no newlines or control "
            f"characters), got {len(text)} characters"
        )
    return text


def cordon(session: Session, agent_ref: str, by: str, reason: str, now: datetime | None = None) -> Agent:
    """Cordons the agent `agent_ref` names: nothing new is placed on it; what it runs keeps running.

    Cordoning a cordoned agent records the new who and why and keeps when it was first cordoned.
    """
    text = check_reason(reason)
    agent = find_agent(session, agent_ref)
    if agent.cordoned_at is None:
        agent.cordoned_at = now or utcnow()
    agent.cordoned_by, agent.cordon_reason = by, text
    session.flush()
    return agent


def uncordon(session: Session, agent_ref: str, by: str, now: datetime | None = None) -> Agent:
    """Ends the agent's cordon (and its drain): jobs may be placed on it again. Conflict when not cordoned."""
    agent = find_agent(session, agent_ref)
    if agent.cordoned_at is None:
        raise Conflict(f"agent {agent.name} is not cordoned; `mwms agents` shows which are")
    agent.cordoned_at, agent.cordoned_by, agent.cordon_reason, agent.draining = None, "", "", False
    session.flush()
    return agent


def jobs_on_agent(session: Session, agent_id: str) -> list[Job]:
    """SCHEDULED or RUNNING jobs with a live (not yet ended) task on the agent, oldest first."""
    return list(
        session.scalars(
            select(Job)
            .where(
                Job.state.in_(_PREEMPTIBLE_JOB_STATES),
                Job.id.in_(
                    select(Task.job_id).where(Task.agent_id == agent_id, Task.state.in_(_LIVE_TASK_STATES))
                ),
            )
            .order_by(Job.created_at, Job.id)
        ).all()
    )


def grace_for(job: Job, grace_s: int | None, default_grace_s: int) -> int:
    """The drain's grace for `job`: the one given, else the job's preemption_grace_seconds, else the default."""
    if grace_s is not None:
        return grace_s
    own = (job.options or {}).get("preemption_grace_seconds")
    return int(own) if isinstance(own, int) else default_grace_s


def drain(
    session: Session,
    agent_ref: str,
    by: str,
    reason: str,
    grace_s: int | None,
    let_finish: bool,
    default_grace_s: int,
    now: datetime | None = None,
    *,
    max_grace_s: int | None = None,
) -> Agent:
    """Cordons the agent and marks it draining; unless `let_finish`, preempts every job it runs.

    Each preempted job's workers get SIGTERM and `grace_for` seconds to save before SIGKILL; the jobs
    then wait again, in their place, for other agents. Draining a draining agent preempts whatever is
    still placed there. A `grace_s` over `max_grace_s` (MWMS_MAX_PREEMPTION_GRACE_S) is refused.
    """
    if grace_s is not None and not 0 <= grace_s <= (max_grace_s if max_grace_s is not None else grace_s):
        raise LimitExceeded(
            f"grace_seconds must be between 0 and {max_grace_s} (MWMS_MAX_PREEMPTION_GRACE_S), got {grace_s}",
            ("body", "grace_seconds"),
        )
    now = now or utcnow()
    agent = cordon(session, agent_ref, by, reason, now)
    agent.draining = True
    if not let_finish:
        why = f"agent {agent.name} is drained by {by}: {agent.cordon_reason or 'no reason given'}"
        for job in jobs_on_agent(session, agent.id):
            ending = attempt_endings.drained(agent, by, agent.cordon_reason)
            preempt_job(
                session, job, "drain", why, grace_for(job, grace_s, default_grace_s), now=now, ending=ending
            )
    session.flush()
    return agent
