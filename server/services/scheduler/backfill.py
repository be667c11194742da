"""Reservation and backfill (EASY backfill), for one scheduler pass (server/services/scheduler/queue_plan.py).

- **Reservation and backfill**: the first job in the order that does not fit gets a reservation: the
  devices that free soonest (running jobs end at `started + max_runtime`; a job without one never ends),
  and the time they do. Jobs after it are placed only on devices the reservation does not need, or on
  reserved ones when their own max_runtime ends before it starts.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from mwms.server.services.scheduler.free_capacity import Free, changed, devices_of
from mwms.server.services.scheduler.placement import place_gang, workers_fitting
from mwms.server.services.scheduler.plan_parts import RunningJob
from mwms.server.services.scheduler.queue_order import WaitingJob


@dataclass
class Reservation:
    job: WaitingJob
    devices: dict[str, set[int]]
    starts_at: datetime | None  # None: not before a job without max_runtime ends


def ends_before(job: WaitingJob, reservation: Reservation, now: datetime) -> bool:
    """Backfill: the job's own max_runtime ends before the reservation starts."""
    if job.max_runtime_s is None:
        return False
    if reservation.starts_at is None:
        return True
    return now + timedelta(seconds=job.max_runtime_s) <= reservation.starts_at


def reserve(
    job: WaitingJob,
    free: Free,
    held: Mapping[str, set[int]],
    running: Sequence[RunningJob],
    now: datetime,
    rng: random.Random,
) -> Reservation | None:
    """The devices that free soonest for `job` and when; None when it cannot fit even on an idle cluster."""
    sim = {a: set(d) - held.get(a, set()) for a, d in free.free.items()}
    freed = {a: 0 for a in free.free}  # memory of the running jobs that ended, per agent
    kinds = {a: agent.device_kind for a, agent in free.agents.items()}

    def agent_units(agent_id: str) -> int:
        memory = free.memory_free(agent_id, freed[agent_id])
        return workers_fitting(len(sim[agent_id]), job.per_worker, memory, job.memory_per_worker)

    def release(r: RunningJob) -> None:
        for agent_id, devices in r.devices.items():
            if agent_id in sim:
                sim[agent_id] |= set(devices) - held.get(agent_id, set())
        for agent_id, memory in r.memory.items():
            if agent_id in freed:
                freed[agent_id] += memory

    total = sum(agent_units(a) for a in sim if kinds[a] == job.kind)
    ending = sorted(
        ((r.ends_at, r) for r in running if r.ends_at is not None and r.kind == job.kind),
        key=lambda pair: pair[0],
    )
    starts_at: datetime | None = None
    found = False
    for ends_at, r in ending:
        touched = [a for a in {*r.devices, *r.memory} if a in sim]
        before = sum(agent_units(a) for a in touched)
        release(r)
        total += sum(agent_units(a) for a in touched) - before
        if total >= job.workers:
            starts_at, found = max(ends_at, now), True
            break
    if not found:
        for r in running:  # then the ones that never end
            if r.kind != job.kind or r.ends_at is not None:
                continue
            release(r)
    offer = [
        changed(agent, tuple(sorted(sim[a])), agent.used_ports, max(0, free.memory_used[a] - freed[a]))
        for a, agent in free.agents.items()
    ]
    tasks = place_gang(offer, job.workers, job.gpus_per_worker, rng, job.memory_per_worker)
    if not isinstance(tasks, list):
        return None
    return Reservation(job, devices_of(tasks), starts_at)
