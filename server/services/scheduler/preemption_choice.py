"""Which running jobs a blocked job preempts, for one scheduler pass (server/services/scheduler/queue_plan.py).

- **Preemption**: a job that does not fit, within its team's quota, may preempt preemptible jobs of
  lower priority, or other teams' borrowed jobs: whole gangs, the fewest devices·seconds lost. The
  devices freed (and the free ones it needs) are held for it until its victims have exited.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import datetime

from mwms.server.services.scheduler.free_capacity import Free, devices_of, merge, units
from mwms.server.services.scheduler.placement import TaskPlacement, place_gang
from mwms.server.services.scheduler.plan_parts import PreemptionDecision, RunningJob
from mwms.server.services.scheduler.queue_order import WaitingJob


def may_preempt(job: WaitingJob, victim: RunningJob) -> bool:
    """Lower priority, or another team's borrowed job while the preemptor's team is within its quota."""
    if victim.priority < job.priority:
        return True
    return victim.borrowed and victim.team != job.team


def _cause(job: WaitingJob, victims: Sequence[RunningJob]) -> str:
    return "priority" if all(v.priority < job.priority for v in victims) else "reclaim"


def choose_victims(
    job: WaitingJob,
    candidates: list[RunningJob],
    free: Free,
    held: Mapping[str, set[int]],
    rng: random.Random,
    now: datetime,
) -> PreemptionDecision | None:
    """The cheapest set of whole gangs whose devices, with the free ones, fit `job`; None when none does."""

    def lost(r: RunningJob) -> float:
        return r.size * max(1.0, (now - r.started_at).total_seconds())

    ranked = sorted(candidates, key=lambda r: (not r.borrowed, r.priority, lost(r), r.job_id))
    chosen: list[RunningJob] = []

    def fits(victims: list[RunningJob]) -> list[TaskPlacement] | None:
        adding = merge(*({a: set(d) for a, d in v.devices.items()} for v in victims))
        freeing: dict[str, int] = {}
        for victim in victims:
            for agent_id, memory in victim.memory.items():
                freeing[agent_id] = freeing.get(agent_id, 0) + memory
        offer = free.offer(without=held, adding=adding, freeing=freeing)
        if units(offer, job.kind, job.per_worker, job.memory_per_worker) < job.workers:
            return None
        tasks = place_gang(offer, job.workers, job.gpus_per_worker, rng, job.memory_per_worker)
        return tasks if isinstance(tasks, list) else None

    for victim in ranked:
        chosen.append(victim)
        if fits(chosen) is not None:
            break
    else:
        return None
    for victim in sorted(chosen, key=lost, reverse=True):  # drop the costliest that are not needed
        rest = [v for v in chosen if v is not victim]
        if rest and fits(rest) is not None:
            chosen = rest
    tasks = fits(chosen)
    assert tasks is not None
    return PreemptionDecision(
        preemptor=job,
        victims=chosen,
        cause=_cause(job, chosen),
        hold={a: tuple(sorted(d)) for a, d in devices_of(tasks).items()},
        hold_s=max(v.grace_s for v in chosen) + 30,
    )
