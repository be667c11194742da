"""The queue as the scheduler sees it: every waiting job in placement order, with why it waits.

Read by `GET /api/v1/queue`, `mwms queue` and the dashboard's queue view. The order and the reasons
come from the same planner the scheduler runs (server/services/scheduler/queue_plan.py); each job's estimated start
for people from server/services/scheduler/start_estimates.py, fed by two more queries (the running jobs' users and
shapes, and their users' recent run times: server/services/job_life/run_history.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, utcnow
from mwms.server.services.job_life.run_history import typical_run_times
from mwms.server.services.scheduler.placement import fitting_now
from mwms.server.services.scheduler.queue_order import WaitingJob
from mwms.server.services.scheduler.queue_plan import PlanInputs
from mwms.server.services.scheduler.scheduling import SharingPolicy, read_inputs
from mwms.server.services.scheduler.start_estimates import (
    MAX_RUNTIME,
    NO_ESTIMATE,
    Estimate,
    Running,
    Waiting,
    earlier,
    estimate_starts,
)
from mwms.server.services.scheduler.wait_reasons import not_placeable
from mwms.server.states import JobState


@dataclass(frozen=True)
class QueueRow:
    """One waiting job: its 1-based position in the order and the typed reason it waits."""

    position: int
    job_id: str
    name: str
    state: str  # PENDING, RESTARTING or PREEMPTING
    team: str
    submitted_by: str
    priority: int
    workers: int
    gpus_per_worker: int
    preemptible: bool
    created_at: datetime
    memory_per_worker: int  # bytes per worker; 0: none asked
    # {"kind": ..., "message": "...", "estimated_start": iso or None, ...details} (wait_reasons.py)
    waiting: dict[str, Any]
    # When it is estimated to start, for people, and on what basis (start_estimates.py).
    estimate: Estimate = NO_ESTIMATE


def queue(session: Session, now: datetime | None = None) -> list[QueueRow]:
    """Every waiting job in the scheduler's order, each with the reason the last pass stored for it.

    The order is computed now, as a pass would (queue_order over the same inputs); a job submitted since
    the last pass shows an empty reason until the next one (within MWMS_SCHEDULER_INTERVAL_S).
    """
    now = now or utcnow()
    inputs = read_inputs(session, now, None, SharingPolicy())
    ids = [job.job_id for job in inputs.order]
    rows = (
        {
            row.id: row
            for row in session.execute(
                select(Job.id, Job.name, Job.submitted_by, Job.waiting).where(Job.id.in_(ids))
            ).all()
        }
        if ids
        else {}
    )
    estimates = _estimates(session, inputs, rows)
    fits: dict[tuple[str, int, int], int] = {}

    def fits_now(job: WaitingJob) -> int:
        """Workers of the job's shape that fit on what is free now, devices and memory (ignoring holds
        and reservations)."""
        key = (job.kind, job.per_worker, job.memory_per_worker)
        if key not in fits:
            fits[key] = sum(
                fitting_now(a, job.per_worker, job.memory_per_worker)
                for a in inputs.offer
                if a.device_kind == job.kind
            )
        return fits[key]

    result = []
    for position, job in enumerate(inputs.order, start=1):
        row = rows.get(job.job_id)
        if row is None:
            continue
        waiting = dict(row.waiting or {}) if job.state == "PENDING" else not_placeable(job.state)
        if waiting.get("kind") == "no_fit":
            waiting["fits_now"] = fits_now(job)
        result.append(
            QueueRow(
                position=position,
                job_id=job.job_id,
                name=row.name,
                state=job.state,
                team=job.team,
                submitted_by=row.submitted_by,
                priority=job.priority,
                workers=job.workers,
                gpus_per_worker=job.gpus_per_worker,
                preemptible=job.preemptible,
                created_at=job.created_at,
                memory_per_worker=job.memory_per_worker,
                waiting=waiting,
                estimate=earlier(estimates.get(job.job_id, NO_ESTIMATE), _reservation(waiting, now)),
            )
        )
    return result


def _estimates(session: Session, inputs: PlanInputs, rows: Mapping[str, Any]) -> dict[str, Estimate]:
    """Every waiting job's estimated start (start_estimates.py): `rows` are the waiting jobs' (id,
    submitted_by, waiting)."""
    offered = {a.agent_id for a in inputs.offer}
    free: dict[str, int] = {}
    for agent in inputs.offer:
        free[agent.device_kind] = free.get(agent.device_kind, 0) + len(agent.free_devices)
    shapes = (
        {
            row.id: row
            for row in session.execute(
                select(Job.id, Job.submitted_by, Job.num_workers, Job.gpus_per_worker, Job.started_at).where(
                    Job.id.in_([r.job_id for r in inputs.running])
                )
            )
        }
        if inputs.running
        else {}
    )
    running = [
        Running(
            kind=r.kind,
            devices=sum(len(d) for agent_id, d in r.devices.items() if agent_id in offered),
            started_at=shape.started_at or inputs.now,
            ends_at=r.ends_at,
            shape=(shape.submitted_by, shape.num_workers, shape.gpus_per_worker),
        )
        for r in inputs.running
        if (shape := shapes.get(r.job_id)) is not None
    ]
    waiting = [
        Waiting(
            job_id=job.job_id,
            kind=job.kind,
            need=job.need,
            shape=(row.submitted_by, job.workers, job.gpus_per_worker),
            max_runtime_s=job.max_runtime_s,
            # Over its team's quota it waits for its team's jobs, pinned for its agents: not for capacity.
            for_capacity=(
                job.state == JobState.PENDING.value
                and not job.pinned
                and not (isinstance(row.waiting, dict) and row.waiting.get("kind") == "over_quota")
            ),
        )
        for job in inputs.order
        if (row := rows.get(job.job_id)) is not None
    ]
    if not any(w.for_capacity for w in waiting):
        return {}
    people = {w.shape[0] for w in waiting if w.for_capacity} | {r.shape[0] for r in running}
    typical = typical_run_times(session, people)
    return estimate_starts(waiting, running, free, typical, inputs.now)


def _reservation(waiting: dict[str, Any], now: datetime) -> Estimate:
    """The head's reservation time from the last pass (max_runtime, per agent), never in the past."""
    at = waiting.get("estimated_start") if waiting.get("kind") == "head" else None
    if not isinstance(at, str):
        return NO_ESTIMATE
    try:
        starts_at = datetime.fromisoformat(at)
    except ValueError:
        return NO_ESTIMATE
    if starts_at.tzinfo is None:
        starts_at = starts_at.replace(tzinfo=timezone.utc)
    return Estimate(max(starts_at, now), MAX_RUNTIME)
