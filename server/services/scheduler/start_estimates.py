"""When a waiting job may start, for people: estimated from what is known about the jobs that run.

The scheduler's reservation (backfill.py) counts only max_runtime, a guarantee backfill relies on, and a
job without one never ends as far as it knows: most have none. This estimate also uses how long jobs of
the same shape usually take. `GET /api/v1/queue` (estimated_start, estimate_basis), `mwms queue` and the
dashboard's queue view show it; it decides nothing. Pure: server/services/scheduler/queue_view.py reads the data.

- **A running job's expected end**: its max_runtime (or, once preempted, its grace) when it has one
  (basis max_runtime). Else its first start plus the typical run time of its user's jobs of the same shape
  (workers × gpus_per_worker): the median of their last few SUCCEEDED runs (run_history.py) (basis
  similar_jobs). A job that has already run longer than that is overdue: it may end any moment, so it is
  expected to end now, and an estimate that rests on that says so (basis overdue) instead of naming a
  time in the past. A job with neither never ends, as far as the estimate knows.
- **Devices are counted per kind** (GPUs, CPU slots): those free now on the agents offered, plus those
  the running jobs hold there. Memory, pins and how a gang splits across agents are not modelled, so an
  estimate may be early for a job that needs whole agents.
- **Queue order, one kind at a time, strictly first come first served**: the jobs that wait for
  capacity (PENDING, neither pinned nor over their team's quota) start in the queue's order as the
  expected ends free devices, each once the jobs ahead of it have started and the devices free then hold
  it. Nothing starts before the first end: the last pass placed what it could. A job started this way
  ends after its own max_runtime, else its user's typical time for its shape, else never, and frees its
  devices for the jobs behind it. Backfill is not modelled (it may start small jobs earlier).
- A job that needs more devices than its kind ever has free is passed over (unknown) and holds nobody
  up; the jobs behind one that never starts wait with it (unknown).
- **Basis** of an estimate: max_runtime when every end it waited for is a max_runtime; overdue when it
  starts now because overdue jobs may end any moment; else similar_jobs. unknown: no estimate (the job
  does not wait for capacity, or the ends it would need are not known).
- The scheduler's own reservation for the head (max_runtime, per agent) stands when it is earlier.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

Basis = Literal["max_runtime", "similar_jobs", "overdue", "unknown"]
MAX_RUNTIME: Final = "max_runtime"
SIMILAR_JOBS: Final = "similar_jobs"
OVERDUE: Final = "overdue"
UNKNOWN: Final = "unknown"

# (user, workers, gpus_per_worker): whose jobs of which shape a typical run time is for.
ShapeKey = tuple[str, int, int]


@dataclass(slots=True)
class Running:
    """A job whose tasks hold devices, as the estimate sees it (plain slotted: one per running job)."""

    kind: str  # "gpu" or "cpu"
    devices: int  # devices of its kind it holds on the offered agents
    started_at: datetime  # when it first ran
    ends_at: datetime | None  # by its max_runtime (or a preemption's grace); None: none
    shape: ShapeKey


@dataclass(slots=True)
class Waiting:
    """A waiting job in queue order; `for_capacity`: it waits for devices to free (see the docstring).
    Plain slotted: the queue view builds thousands."""

    job_id: str
    kind: str
    need: int  # devices of its kind the whole gang takes
    shape: ShapeKey
    max_runtime_s: float | None
    for_capacity: bool


@dataclass(frozen=True, slots=True)
class Estimate:
    starts_at: datetime | None
    basis: Basis


NO_ESTIMATE = Estimate(None, UNKNOWN)


def typical_run_time(run_times_s: Iterable[float]) -> float | None:
    """The median of some finished runs' seconds; None when there are none."""
    values = [s for s in run_times_s if s >= 0]
    return statistics.median(values) if values else None


def expected_end(
    job: Running, typical_s: Mapping[ShapeKey, float], now: datetime
) -> tuple[datetime, Basis] | None:
    """When a running job is expected to end and on what basis; None when nothing tells."""
    if job.ends_at is not None:
        return max(job.ends_at, now), MAX_RUNTIME
    typical = typical_s.get(job.shape)
    if typical is None:
        return None
    ends_at = job.started_at + timedelta(seconds=typical)
    return (ends_at, SIMILAR_JOBS) if ends_at > now else (now, OVERDUE)


def estimate_starts(
    waiting: Sequence[Waiting],
    running: Sequence[Running],
    free: Mapping[str, int],
    typical_s: Mapping[ShapeKey, float],
    now: datetime,
) -> dict[str, Estimate]:
    """Every waiting job's estimate, by job id (see the module docstring); `free`: devices free per kind."""
    result = {job.job_id: NO_ESTIMATE for job in waiting}
    for kind in {job.kind for job in waiting if job.for_capacity}:
        queue = [job for job in waiting if job.for_capacity and job.kind == kind]
        result.update(
            _estimate_kind(queue, [r for r in running if r.kind == kind], free.get(kind, 0), typical_s, now)
        )
    return result


def _estimate_kind(
    queue: Sequence[Waiting],
    running: Sequence[Running],
    free: int,
    typical_s: Mapping[ShapeKey, float],
    now: datetime,
) -> dict[str, Estimate]:
    """Strict queue order over one kind's devices: a walk over the expected ends, soonest first."""
    most = free + sum(r.devices for r in running)
    queue = [job for job in queue if job.need <= most]
    # (time, order, devices freed, the weakest basis it rests on); the order keeps equal times stable.
    order = itertools.count()
    ends: list[tuple[datetime, int, int, Basis]] = []
    for r in running:
        end = expected_end(r, typical_s, now)
        if end is not None and r.devices > 0:
            ends.append((end[0], next(order), r.devices, end[1]))
    heapq.heapify(ends)
    result: dict[str, Estimate] = {}
    waited_on: Basis = MAX_RUNTIME  # the weakest basis of the ends processed so far
    overdue = False
    position = 0
    estimate = NO_ESTIMATE
    while ends and position < len(queue):
        at = ends[0][0]
        while ends and ends[0][0] == at:
            _, _, devices, basis = heapq.heappop(ends)
            free += devices
            overdue = overdue or basis == OVERDUE
            if basis != MAX_RUNTIME:
                waited_on = SIMILAR_JOBS
        while position < len(queue) and queue[position].need <= free:
            job = queue[position]
            position += 1
            free -= job.need
            basis = OVERDUE if overdue and at <= now else waited_on
            if estimate.starts_at != at or estimate.basis != basis:
                estimate = Estimate(at, basis)  # shared by the jobs that start together
            result[job.job_id] = estimate
            run_s, run_basis = _run_time(job, typical_s)
            if run_s is not None:
                weakest: Basis = MAX_RUNTIME if basis == run_basis == MAX_RUNTIME else SIMILAR_JOBS
                heapq.heappush(ends, (at + timedelta(seconds=run_s), next(order), job.need, weakest))
    return result


def _run_time(job: Waiting, typical_s: Mapping[ShapeKey, float]) -> tuple[float | None, Basis]:
    """How long a waiting job is expected to run once it starts, and on what basis."""
    if job.max_runtime_s is not None:
        return job.max_runtime_s, MAX_RUNTIME
    return typical_s.get(job.shape), SIMILAR_JOBS


def earlier(first: Estimate, second: Estimate) -> Estimate:
    """The estimate that starts sooner (an unknown one never does)."""
    if first.starts_at is None:
        return second
    if second.starts_at is None:
        return first
    return second if second.starts_at < first.starts_at else first
