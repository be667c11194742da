"""The scheduler pass: restarts whose backoff has passed go back to PENDING; PENDING jobs are gang-placed."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db.models import Attempt, Job, Task, utcnow
from server.services.agents import capacities
from server.services.placement import NoFit, place_gang
from server.services.tf_config import build_tf_config
from server.services.transitions import transition_job
from server.services.wording import count
from server.states import AttemptState, JobState, TaskState


def release_restarts(session: Session, now: datetime) -> None:
    """RESTARTING jobs whose backoff is over and whose old tasks have all ended become PENDING."""
    jobs = session.scalars(select(Job).where(Job.state == JobState.RESTARTING.value)).all()
    for job in jobs:
        if job.not_before is not None and job.not_before > now:
            continue
        if any(not TaskState(t.state).terminal for a in job.attempts for t in a.tasks):
            continue
        transition_job(session, job, JobState.PENDING, f"placing attempt {len(job.attempts) + 1}", now)


def schedule_pending(
    session: Session, now: datetime | None = None, connected: frozenset[str] | None = None
) -> list[str]:
    """Places every PENDING job that fits, oldest first; returns the ids of agents that got tasks.

    `connected`: when given, only agents with a live session are offered (see agents.capacities).
    """
    now = now or utcnow()
    release_restarts(session, now)
    jobs = session.scalars(
        select(Job).where(Job.state == JobState.PENDING.value).order_by(Job.created_at, Job.id)
    ).all()
    touched: set[str] = set()
    for job in jobs:
        placement = place_gang(capacities(session, now, connected), job.num_workers, job.gpus_per_worker)
        if isinstance(placement, NoFit):
            if job.reason != placement.reason:
                job.reason = placement.reason  # same state, newer explanation: not a transition
            continue
        attempt = Attempt(job_id=job.id, number=len(job.attempts) + 1, state=AttemptState.ACTIVE.value)
        job.attempts.append(attempt)
        session.flush()
        endpoints = [p.endpoint for p in placement]
        for p in placement:
            attempt.tasks.append(
                Task(
                    job_id=job.id,
                    attempt_id=attempt.id,
                    attempt_number=attempt.number,
                    index=p.index,
                    agent_id=p.agent_id,
                    host=p.address,
                    port=p.port,
                    device_kind=p.device_kind,
                    device_indices=list(p.device_indices),
                    tf_config=build_tf_config(endpoints, p.index),
                    state=TaskState.ASSIGNED.value,
                )
            )
            touched.add(p.agent_id)
        session.flush()
        agents = sorted({p.agent_id for p in placement})
        transition_job(
            session,
            job,
            JobState.SCHEDULED,
            f"attempt {attempt.number}: {count(len(placement), 'worker')} on {count(len(agents), 'agent')}: "
            + ", ".join(endpoints),
            now,
        )
    return sorted(touched)
