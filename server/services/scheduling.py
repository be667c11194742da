"""The scheduler pass: restarts whose backoff has passed go back to PENDING; PENDING jobs are gang-placed.

The rules for what a placed or restarting job becomes are in server/services/lifecycle.py.
Each job is handled in its own savepoint (server.poison.isolated): a job whose row cannot be placed is
logged once, counted and skipped, and the jobs behind it are still placed on this pass.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db.models import Job, Task, utcnow
from server.poison import isolated
from server.services.agent_references import pin_candidates
from server.services.agents import capacities
from server.services.lifecycle import attempt_placed, open_attempt, release_restart
from server.services.placement import AgentCapacity, NoFit, place_gang, place_pinned
from server.services.tf_config import build_tf_config
from server.states import JobState, TaskState

log = logging.getLogger("mwms.server.scheduling")


def release_restarts(session: Session, now: datetime) -> None:
    """RESTARTING jobs whose backoff is over and whose old tasks have all ended become PENDING."""
    jobs = session.scalars(select(Job).where(Job.state == JobState.RESTARTING.value)).all()
    for job in jobs:
        with isolated(session, log, "restart_job", job.id, f"restart of job {job.id}"):
            release_restart(session, job, now)


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
    # What the agents offer is read once and again only after a job was placed: a job that does not fit
    # changes nothing, so a backlog of waiting jobs costs one read per pass, not one per job.
    offer: list[AgentCapacity] | None = None
    for job in jobs:
        with isolated(session, log, "schedule_job", job.id, f"placement of job {job.id}"):
            if offer is None:
                offer = capacities(session, now, connected)
            placed = _place(session, job, now, offer)
            if placed:
                offer = None
            touched.update(placed)
    return sorted(touched)


def _place(session: Session, job: Job, now: datetime, offer: list[AgentCapacity]) -> list[str]:
    """Places one PENDING job if it fits `offer`; returns the ids of the agents that got its tasks."""
    pinned = job.options.get("agents")
    if pinned:
        known = pin_candidates(session, pinned)
        placement = place_pinned(offer, list(pinned), job.gpus_per_worker, known=known)
    else:
        placement = place_gang(offer, job.num_workers, job.gpus_per_worker)
    if isinstance(placement, NoFit):
        if job.reason != placement.reason:
            job.reason = placement.reason  # same state, newer explanation: not a transition
        return []
    attempt = open_attempt(session, job, now)
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
    session.flush()
    agents = sorted({p.agent_id for p in placement})
    attempt_placed(session, job, attempt, endpoints, agents, now)
    return agents
