"""Applying a scheduler pass's plan (server/services/scheduler/scheduling.py, apply_plan): placements,
preemptions and the waiting jobs' reasons.

Only jobs the plan places or preempts are loaded as ORM objects. Before a placement, its agents and
devices are checked again (what the pass read may have changed since); a device the database says is
held (a plan made on a stale read) drops that placement alone (server/services/scheduler/device_claims.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Job, Task, new_id
from mwms.server.observability.instruments import observe_queue_wait
from mwms.server.services.job_life.lifecycle import attempt_placed, open_attempt, preempt_job
from mwms.server.services.job_life.tf_config import build_tf_config
from mwms.server.services.scheduler import device_claims
from mwms.server.services.scheduler.placement import shared_agent_note
from mwms.server.services.scheduler.queue_order import WaitingJob
from mwms.server.services.scheduler.queue_plan import Placement, PreemptionDecision
from mwms.server.states import DEVICE_HOLDING_TASK_STATES, AttemptState, JobState, TaskState

if TYPE_CHECKING:
    from mwms.server.services.scheduler.scheduling import SharingPolicy

log = logging.getLogger("mwms.server.scheduling")


def still_free(session: Session, placements: list[Placement], now: datetime) -> Callable[[Placement], bool]:
    """A check that a placement's agents are still online, not removed or cordoned, and its devices free."""
    agent_ids = sorted({t.agent_id for p in placements for t in p.tasks})
    if not agent_ids:
        return lambda placement: True
    usable = set(
        session.scalars(
            select(Agent.id).where(
                Agent.id.in_(agent_ids),
                Agent.removed_at.is_(None),
                Agent.cordoned_at.is_(None),
                Agent.online_until > now,
            )
        ).all()
    )
    taken = {
        (agent_id, int(i))
        for agent_id, indices in session.execute(
            select(Task.agent_id, Task.device_indices).where(
                Task.agent_id.in_(agent_ids), Task.state.in_(DEVICE_HOLDING_TASK_STATES)
            )
        )
        for i in indices
    }

    def check(placement: Placement) -> bool:
        wanted = [(t.agent_id, i) for t in placement.tasks for i in t.device_indices]
        if any(t.agent_id not in usable for t in placement.tasks) or any(d in taken for d in wanted):
            return False
        taken.update(wanted)
        return True

    return check


def apply_placement(
    session: Session, placement: Placement, names: Mapping[str, str], now: datetime
) -> list[str]:
    """Places one job, its device claims included; a device the database says is held (a plan made on
    a stale read) drops this placement alone, and the next pass plans again."""
    try:
        with session.begin_nested():
            return _place(session, placement, names, now)
    except IntegrityError as error:
        if not device_claims.is_conflict(error):
            raise
        log.warning(
            "job %s not placed: a device it was planned on is held (a stale plan)", placement.job.job_id
        )
        return []


def _place(session: Session, placement: Placement, names: Mapping[str, str], now: datetime) -> list[str]:
    """Opens the job's attempt with its tasks where `placement` says; `names`: agent id -> name."""
    job = session.get(Job, placement.job.job_id)
    if job is None or job.state != JobState.PENDING.value:
        return []
    waited_since = job.events[-1].at if job.events else job.created_at
    previous = job.attempts[-1] if job.attempts else None
    if previous is not None and previous.state == AttemptState.PREEMPTED.value and previous.ended_at:
        # Time spent preempted is not run time: max_runtime_seconds counts what the job ran.
        paused = float(job.options.get("preempted_s") or 0) + (now - previous.ended_at).total_seconds()
        job.options = {**job.options, "preempted_s": paused}
    attempt = open_attempt(session, job, now)
    attempt.borrowed = placement.borrowed
    endpoints = [p.endpoint for p in placement.tasks]
    # The gang's rows in one statement, not through the unit of work (the 64-worker job's placement
    # 20 -> 14 ms, offline); the attempt's task list loads again when it is next read.
    ids = [new_id() for _ in placement.tasks]
    tasks = [
        {
            "id": task_id,
            "job_id": job.id,
            "attempt_id": attempt.id,
            "attempt_number": attempt.number,
            "index": p.index,
            "agent_id": p.agent_id,
            "host": p.address,
            "port": p.port,
            "device_kind": p.device_kind,
            "device_indices": list(p.device_indices),
            "tf_config": build_tf_config(endpoints, p.index),
            "state": TaskState.ASSIGNED.value,
            "created_at": now,
        }
        for p, task_id in zip(placement.tasks, ids, strict=True)
    ]
    session.execute(insert(Task), tasks)
    session.expire(attempt, ["tasks"])
    job.hold, job.hold_until, job.waiting = None, None, {}
    device_claims.claim(
        session,
        [
            (p.agent_id, int(i), task_id)
            for p, task_id in zip(placement.tasks, ids, strict=True)
            for i in p.device_indices
        ],
    )
    agents = sorted({p.agent_id for p in placement.tasks})
    attempt_placed(session, job, attempt, endpoints, agents, now, shared_agent_note(placement.tasks, names))
    if placement.borrowed:
        job.reason += f"; borrowing idle capacity over team {job.team!r}'s quota (reclaimed first)"
    observe_queue_wait(session, job.priority, (now - waited_since).total_seconds())
    return agents


def apply_preemption(
    session: Session, decision: PreemptionDecision, policy: SharingPolicy, now: datetime
) -> list[str]:
    preemptor = session.get(Job, decision.preemptor.job_id)
    if preemptor is None or preemptor.state != JobState.PENDING.value:
        return []
    touched: set[str] = set()
    for victim in decision.victims:
        job = session.get(Job, victim.job_id)
        if job is None:
            continue
        why = (
            f"job {preemptor.id} of priority {preemptor.priority} needs its devices"
            if decision.cause == "priority"
            else f"team {preemptor.team!r} reclaims its quota for job {preemptor.id} (this job borrowed it)"
        )
        if preempt_job(session, job, decision.cause, why, victim.grace_s, preemptor, now):
            touched.update(victim.devices)
    preemptor.hold = {a: list(d) for a, d in decision.hold.items()}
    preemptor.hold_until = now + timedelta(seconds=decision.hold_s)
    return sorted(touched)


def reason_changes(
    order: Iterable[WaitingJob], reasons: Mapping[str, dict[str, Any]], placed: set[str]
) -> list[tuple[WaitingJob, dict[str, Any]]]:
    """The PENDING jobs of `order` not `placed` whose reason in `reasons` is not the one stored (one look at
    each of thousands of waiting jobs, so it keeps to local names)."""
    pending = JobState.PENDING.value
    get = reasons.get
    changes = []
    for job in order:
        if job.state != pending:
            continue
        reason = get(job.job_id)
        if reason is not None and job.stored_reason != reason["message"] and job.job_id not in placed:
            changes.append((job, reason))
    return changes


def store_reasons(session: Session, changes: list[tuple[WaitingJob, dict[str, Any]]]) -> None:
    """Writes each changed waiting job's typed reason (and its text as `reason`), from `reason_changes`, in
    one batch."""
    if not changes:
        return
    rows = []
    for job, reason in changes:
        rows.append({"job": job.job_id, "new_waiting": reason, "new_reason": reason["message"]})
        job.stored_reason = reason["message"]  # what a cached WaitingJob compares with next pass
    # Only jobs still PENDING: one cancelled since the pass read it keeps the reason it ended with.
    statement = (
        update(Job)
        .where(Job.id == bindparam("job"), Job.state == JobState.PENDING.value)
        .values(waiting=bindparam("new_waiting"), reason=bindparam("new_reason"))
    )
    session.connection().execute(statement, rows)
