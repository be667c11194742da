"""The queue as the scheduler sees it: every waiting job in placement order, with why it waits.

Read by `GET /api/v1/queue`, `mwms queue` and the dashboard's queue view. The order and the reasons
come from the same planner the scheduler runs (server/services/queue_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, utcnow
from mwms.server.services.placement import fitting_now
from mwms.server.services.queue_order import WaitingJob
from mwms.server.services.scheduling import SharingPolicy, read_inputs
from mwms.server.services.wait_reasons import not_placeable


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
            )
        )
    return result
