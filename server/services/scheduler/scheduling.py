"""The scheduler pass: read the cluster, plan (server/services/scheduler/queue_plan.py), apply the plan.

Restarts whose backoff has passed and preempted jobs whose workers have all exited go back to PENDING
first (the rules are in server/services/job_life/lifecycle.py). The waiting jobs are read as plain rows, not
ORM objects, so a backlog of thousands costs one query; only jobs the plan places or preempts are
loaded. Each placement and preemption is applied in its own savepoint (mwms.server.poison.isolated): a
job whose row cannot be handled is logged once, counted and skipped, and the others still are.

This module holds the pass itself; its reads are in pass_inputs.py (with the job rows in job_rows.py) and
the writes of a plan in plan_apply.py (all in server/services/scheduler/).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mwms.server.db.engine import Database
from mwms.server.db.models import Job, utcnow
from mwms.server.poison import isolated
from mwms.server.services.job_life.lifecycle import release_preempted, release_restart
from mwms.server.services.scheduler import pass_check, plan_apply
from mwms.server.services.scheduler.job_rows import WAITING_STATES as WAITING_STATES
from mwms.server.services.scheduler.job_rows import hold_of as hold_of
from mwms.server.services.scheduler.job_rows import read_holds as read_holds
from mwms.server.services.scheduler.job_rows import read_running as read_running
from mwms.server.services.scheduler.job_rows import read_waiting as read_waiting
from mwms.server.services.scheduler.pass_inputs import read_inputs as read_inputs
from mwms.server.services.scheduler.queue_order import WaitingJob
from mwms.server.services.scheduler.queue_plan import Plan, PlanInputs, plan_pass
from mwms.server.states import JobState

if TYPE_CHECKING:
    from mwms.server.services.scheduler.waiting_jobs import WaitingJobs

log = logging.getLogger("mwms.server.scheduling")
_RELEASABLE = (JobState.RESTARTING.value, JobState.PREEMPTING.value)


@dataclass(frozen=True)
class SharingPolicy:
    """The coordinator's preemption settings (server/settings.py, sharing section)."""

    grace_s: int = 30
    min_runtime_s: float = 60.0
    max_preemptions_per_hour: int = 4

    @classmethod
    def of(cls, settings: Any) -> SharingPolicy:
        return cls(
            grace_s=settings.preemption_grace_s,
            min_runtime_s=settings.preemption_min_runtime_s,
            max_preemptions_per_hour=settings.max_preemptions_per_hour,
        )


def release_waiting(session: Session, now: datetime) -> None:
    """RESTARTING jobs past their backoff, and PREEMPTING jobs whose tasks have all ended, become PENDING."""
    jobs = session.scalars(select(Job).where(Job.state.in_(_RELEASABLE))).all()
    for job in jobs:
        with isolated(session, log, "restart_job", job.id, f"release of job {job.id}"):
            if job.state == JobState.RESTARTING.value:
                release_restart(session, job, now)
            else:
                release_preempted(session, job, now)


def schedule_pending(
    session: Session,
    now: datetime | None = None,
    connected: frozenset[str] | None = None,
    policy: SharingPolicy | None = None,
) -> list[str]:
    """One pass in one transaction; returns the ids of agents that got tasks or stops.

    `connected`: when given, only agents with a live session are offered (see agents.capacities).
    """
    now = now or utcnow()
    policy = policy or SharingPolicy()
    release_waiting(session, now)
    inputs = read_inputs(session, now, connected, policy)
    if not inputs.order:
        return []
    plan = plan_pass(inputs)
    pass_check.check(inputs, plan)
    return apply_plan(session, inputs, plan, policy, now)


def schedule_pass(
    db: Database,
    now: datetime | None = None,
    connected: frozenset[str] | None = None,
    policy: SharingPolicy | None = None,
    waiting_jobs: WaitingJobs | None = None,
    phases: dict[str, float] | None = None,
) -> list[str]:
    """One pass as the coordinator runs it: it plans in a read transaction and takes the writer only to
    release waiting jobs and to apply the plan, so submits, reports and heartbeats wait at most for those.

    Only this loop places tasks, so what it read stays true but for tasks ending (which frees devices)
    and agents leaving or being cordoned; apply_plan checks those again before it places.
    `phases`, when given, receives the seconds each part took: release, the reads (waiting, agents,
    running, others) and the order, plan, check, apply.
    """
    now = now or utcnow()
    policy = policy or SharingPolicy()
    clock = _Phases(phases)
    with db.read() as session:
        releasable = session.scalar(select(func.count()).select_from(Job).where(Job.state.in_(_RELEASABLE)))
    if releasable:
        with db.write() as session:
            release_waiting(session, now)
    clock.lap("release")
    quiet = waiting_jobs.quiet_key if waiting_jobs is not None else None
    with db.read() as session:
        inputs = read_inputs(
            session, now, connected, policy, waiting_jobs, unless_same_as=quiet, lap=clock.lap
        )
        plan = plan_pass(inputs) if inputs.order else None
        clock.lap("plan")
        if plan is not None:
            pass_check.check(inputs, plan)
        clock.lap("check")
    decided = plan is not None and bool(plan.placements or plan.preemptions)
    touched: list[str] = []
    changes = plan_apply.reason_changes(inputs.order, plan.waiting, _placed(plan)) if plan is not None else []
    if plan is not None and (decided or changes):
        with db.write() as session:
            touched = apply_plan(session, inputs, plan, policy, now, changes)
    clock.lap("apply")
    if (
        waiting_jobs is not None
    ):  # a pass that placed and preempted nothing decides the same on the same inputs
        waiting_jobs.quiet_key = None if decided else inputs.key
    return touched


class _Phases:
    """Seconds per part of a pass, into `into` (nothing when None)."""

    def __init__(self, into: dict[str, float] | None) -> None:
        self._into = into
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self._into is None:
            return
        now = time.perf_counter()
        self._into[name] = self._into.get(name, 0.0) + now - self._last
        self._last = now


def apply_plan(
    session: Session,
    inputs: PlanInputs,
    plan: Plan,
    policy: SharingPolicy,
    now: datetime,
    changes: list[tuple[WaitingJob, dict[str, Any]]] | None = None,
) -> list[str]:
    """Places, preempts and stores reasons as `plan` says; returns the agents that got tasks or stops.
    `changes`: the reasons to store (plan_apply.reason_changes), when the caller has them already."""
    touched: set[str] = set()
    still_free = plan_apply.still_free(session, plan.placements, now)
    names = {agent.agent_id: agent.name for agent in inputs.offer}
    for placement in plan.placements:
        if not still_free(placement):
            continue  # an agent left, was cordoned, or its device is taken: the next pass sees why
        with isolated(
            session, log, "schedule_job", placement.job.job_id, f"placement of job {placement.job.job_id}"
        ):
            touched.update(plan_apply.apply_placement(session, placement, names, now))
    for decision in plan.preemptions:
        with isolated(
            session,
            log,
            "preempt_job",
            decision.preemptor.job_id,
            f"preemption for {decision.preemptor.job_id}",
        ):
            touched.update(plan_apply.apply_preemption(session, decision, policy, now))
    if changes is None:
        changes = plan_apply.reason_changes(inputs.order, plan.waiting, _placed(plan))
    plan_apply.store_reasons(session, changes)
    return sorted(touched)


def _placed(plan: Plan) -> set[str]:
    return {p.job.job_id for p in plan.placements}
