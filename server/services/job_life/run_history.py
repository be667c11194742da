"""How long a user's jobs of one shape usually run: what start estimates (start_estimates.py) use for
running jobs without a max_runtime.

A shape is (workers, gpus_per_worker); a run time is a SUCCEEDED job's finished_at - started_at (from its
first start to its end, restarts included). One query for every user and shape at once, bounded twice: it
looks at the SCAN_LIMIT most recently created SUCCEEDED jobs at most (a range of ix_jobs_state_created_id,
however many jobs the table holds), and of those at the PER_SHAPE newest of each user and shape.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job
from mwms.server.services.scheduler.start_estimates import ShapeKey, typical_run_time
from mwms.server.states import JobState

PER_SHAPE = 20
SCAN_LIMIT = 5000


def typical_run_times(session: Session, users: Collection[str]) -> dict[ShapeKey, float]:
    """{(user, workers, gpus_per_worker): median seconds} over the recent successes of `users`' jobs."""
    if not users:
        return {}
    recent = (
        select(Job.submitted_by, Job.num_workers, Job.gpus_per_worker, Job.started_at, Job.finished_at)
        .where(Job.state == JobState.SUCCEEDED.value)
        .order_by(Job.created_at.desc(), Job.id.desc())
        .limit(SCAN_LIMIT)
        .subquery()
    )
    shape = (recent.c.submitted_by, recent.c.num_workers, recent.c.gpus_per_worker)
    ranked = (
        select(
            *shape,
            recent.c.started_at,
            recent.c.finished_at,
            func.row_number().over(partition_by=shape, order_by=recent.c.finished_at.desc()).label("newest"),
        )
        .where(
            recent.c.submitted_by.in_(sorted(set(users))),
            recent.c.started_at.is_not(None),
            recent.c.finished_at.is_not(None),
        )
        .subquery()
    )
    rows = session.execute(
        select(
            ranked.c.submitted_by,
            ranked.c.num_workers,
            ranked.c.gpus_per_worker,
            ranked.c.started_at,
            ranked.c.finished_at,
        ).where(ranked.c.newest <= PER_SHAPE)
    ).all()
    samples: dict[ShapeKey, list[float]] = {}
    for user, workers, gpus, started, finished in rows:
        samples.setdefault((user, workers, gpus), []).append((finished - started).total_seconds())
    typical = {key: typical_run_time(values) for key, values in samples.items()}
    return {key: seconds for key, seconds in typical.items() if seconds is not None}
