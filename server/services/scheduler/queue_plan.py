"""One scheduler pass decided over plain data: what to place, what to preempt, and why the rest wait.

Pure (server/services/scheduler/scheduling.py reads the data and applies the plan), so every rule is tested
without a database:

- **Order**: queue_order.py (priority, fair share, age).
- **Memory**: free_capacity.py (memory counts against each agent's as devices do).
- **Quotas**: a job that would take its team over quota waits (over_quota), unless it is preemptible
  and the capacity is idle: then it borrows, and is the first to be reclaimed.
- **Reservation and backfill** (EASY backfill): backfill.py.
- **Connecting agents**: a job that fits once agents that are online but not connected yet have connected
  (a fraction of a second after a registration, or a coordinator start's reconnect grace) waits for them
  with that reason: it neither preempts nor takes the reservation.
- **Preemption**: preemption_choice.py (whole gangs of lower priority, or other teams' borrowed jobs).

The pass's own state (what is free, held and reserved as it goes down the order) is _Pass; the pieces of
a plan are in plan_parts.py.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mwms.server.services.scheduler import wait_reasons
from mwms.server.services.scheduler.backfill import Reservation, ends_before, reserve
from mwms.server.services.scheduler.free_capacity import Free, Idle, devices_of, merge
from mwms.server.services.scheduler.placement import (
    AgentCapacity,
    NoFit,
    TaskPlacement,
    place_gang,
    place_pinned,
)
from mwms.server.services.scheduler.plan_parts import Placement as Placement
from mwms.server.services.scheduler.plan_parts import PreemptionDecision as PreemptionDecision
from mwms.server.services.scheduler.plan_parts import RunningJob as RunningJob
from mwms.server.services.scheduler.preemption_choice import choose_victims, may_preempt
from mwms.server.services.scheduler.queue_order import WaitingJob

# Blocked jobs per pass that may look for victims, and that may try for the reservation (one whose gang
# could not fit even on an idle cluster gets none): each is a few placement tries.
MAX_PREEMPTION_SEARCHES = 3
MAX_RESERVATION_TRIES = 3
_NO_QUOTA: Mapping[str, int | None] = {}


@dataclass
class Plan:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[PreemptionDecision] = field(default_factory=list)
    waiting: dict[str, dict[str, Any]] = field(default_factory=dict)  # job_id -> wait_reasons dict


@dataclass(frozen=True)
class PlanInputs:
    order: Sequence[WaitingJob]
    offer: Sequence[AgentCapacity]  # online, connected, not cordoned
    cordoned: Sequence[AgentCapacity]
    running: Sequence[RunningJob]
    usage: Mapping[str, Mapping[str, int]]
    quotas: Mapping[str, Mapping[str, int | None]]
    now: datetime
    known_agents: Sequence[tuple[str, str]] = ()  # (id, name) of every agent, for pins
    # Online (registered or heard from) but without a stream here yet: an agent between its registration
    # and its stream, or one reconnecting after a coordinator start. Not offered, but named in reasons.
    connecting: Sequence[AgentCapacity] = ()
    rng: random.Random | None = None
    # What was read, as a value: a pass that decided nothing needs no new plan while it stays the same.
    key: Hashable = None


def plan_pass(inputs: PlanInputs) -> Plan:
    """Decides the pass (see the module docstring)."""
    state = _Pass(inputs)
    for job in inputs.order:
        state.decide(job)
    return state.plan


class _Pass:
    """One pass down the order: what is free, held for preemptors and reserved, as it places and decides."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.now, self.rng = inputs.now, inputs.rng or random.Random()
        self.plan = Plan()
        self.free = Free(inputs.offer)
        self.holds = {j.job_id: {a: set(d) for a, d in j.hold.items()} for j in inputs.order if j.hold}
        self.held_all = merge(*self.holds.values())
        self.usage = {team: dict(used) for team, used in inputs.usage.items()}
        self.preemptable = {r.job_id: r for r in inputs.running if r.preemptable}
        self.reservation: Reservation | None = None
        self.searches = 0
        self.cache: dict[tuple[Any, ...], int] = {}
        self.reservation_tries = 0
        self.reasons: dict[tuple[Any, ...], dict[str, Any]] = {}
        # Once a job holds the reservation, holds and the reservation stay as they are for the rest of
        # the pass: a plain job (no hold, within quota) that does not fit is told what the last job of
        # its fit was, until a placement changes what is free. Most of a long queue is decided here.
        self.settled: dict[tuple[int, tuple[Any, ...]], dict[str, Any]] = {}
        self.idle = Idle(inputs.offer, inputs.cordoned, inputs.connecting)

    def blocked_for(self, job: WaitingJob) -> dict[str, set[int]]:
        """What the job may not use: others' holds, and the reservation unless it is its own or it backfills."""
        own = self.holds.get(job.job_id, {})
        blocked = {a: d - own.get(a, set()) for a, d in self.held_all.items()}
        reservation = self.reservation
        if (
            reservation is not None
            and reservation.job.job_id != job.job_id
            and not ends_before(job, reservation, self.now)
        ):
            blocked = merge(blocked, reservation.devices)
        return blocked

    def plain_units(self, job: WaitingJob) -> int:
        key = (self.free.version, job.kind, job.per_worker, job.memory_per_worker)
        if key not in self.cache:
            self.cache[key] = self.free.units(job.kind, job.per_worker, self.held_all, job.memory_per_worker)
        return self.cache[key]

    def units_for(self, job: WaitingJob, own_hold: bool) -> int:
        """Workers of the job's shape its offer holds; cached for the common case (no hold, no backfill)."""
        if own_hold or self.reservation is None or ends_before(job, self.reservation, self.now):
            return self.free.units(job.kind, job.per_worker, self.blocked_for(job), job.memory_per_worker)
        key = (self.free.version, job.kind, job.per_worker, job.memory_per_worker, -1)
        if key not in self.cache:
            self.cache[key] = self.free.units(
                job.kind, job.per_worker, self.blocked_for(job), job.memory_per_worker
            )
        return self.cache[key]

    def blocked(self, job: WaitingJob) -> dict[str, Any]:
        key = (
            self.free.version,
            len(self.held_all),
            job.kind,
            job.per_worker,
            job.workers,
            job.memory_per_worker,
        )
        if key not in self.reasons:
            self.reasons[key] = _blocked_reason(
                job, self.free, self.held_all, self.idle, self.reservation, self.holds
            )
        return self.reasons[key]

    def decide(self, job: WaitingJob) -> None:
        """Places the job, or decides a preemption or the reservation for it, or says why it waits."""
        waiting = self.plan.waiting
        if job.state != "PENDING":
            waiting[job.job_id] = wait_reasons.not_placeable(job.state)
            return
        limit = self.inputs.quotas.get(job.team, _NO_QUOTA).get(job.kind)
        in_use, over_quota = 0, False
        if limit is not None:
            in_use = self.usage.get(job.team, {}).get(job.kind, 0)
            over_quota = in_use + job.need > limit
            if over_quota and not job.preemptible:
                waiting[job.job_id] = wait_reasons.over_quota(job, in_use, limit, borrowable=False)
                return
        if job.pinned:
            self.place_pinned(job, job.pinned, over_quota)
            return
        own_hold = job.job_id in self.holds
        settled = None
        if self.reservation is not None and not (own_hold or over_quota):
            settled = (self.free.version, job.fit)
            reason = self.settled.get(settled)
            if reason is not None:
                waiting[job.job_id] = reason
                return
        if self.place(job, own_hold, over_quota):
            return
        if over_quota and limit is not None:
            # Borrowing takes idle capacity only: it never preempts and never reserves.
            waiting[job.job_id] = wait_reasons.over_quota(job, in_use, limit, borrowable=True)
            return
        if own_hold:
            waiting[job.job_id] = wait_reasons.preempting_for(job)
            return
        # Each of these acts only while no job holds the reservation (most jobs of a long queue come after).
        if self.reservation is None and (
            self.wait_for_connecting(job, own_hold) or self.preempt_for(job) or self.reserve_for(job)
        ):
            return
        reason = waiting[job.job_id] = self.blocked(job)
        if settled is not None:
            self.settled[settled] = reason

    def place_pinned(self, job: WaitingJob, pins: Sequence[str], over_quota: bool) -> None:
        """Places the job on the agents it pins, or says why it cannot."""
        pinned = place_pinned(
            self.free.offer(without=self.blocked_for(job)),
            list(pins),
            job.gpus_per_worker,
            self.rng,
            known=self.inputs.known_agents or None,
            memory_per_worker=job.memory_per_worker,
        )
        if isinstance(pinned, NoFit):
            self.plan.waiting[job.job_id] = wait_reasons.pinned(pinned.reason)
        else:
            _placed(self.plan, self.free, self.usage, job, pinned, borrowed=over_quota)

    def place(self, job: WaitingJob, own_hold: bool, over_quota: bool) -> bool:
        """Places the job's gang on what it may use, when it fits there; whether it did."""
        if (own_hold or self.plain_units(job) >= job.workers) and self.units_for(
            job, own_hold
        ) >= job.workers:
            tasks = place_gang(
                self.free.offer(without=self.blocked_for(job)),
                job.workers,
                job.gpus_per_worker,
                self.rng,
                job.memory_per_worker,
            )
            if isinstance(tasks, list):
                _placed(self.plan, self.free, self.usage, job, tasks, borrowed=over_quota)
                return True
        return False

    def wait_for_connecting(self, job: WaitingJob, own_hold: bool) -> bool:
        """Whether the job fits once connecting agents connect: then it waits for them (Connecting agents)."""
        if not (
            self.reservation is None
            and self.idle.connecting
            and self.units_for(job, own_hold) + self.idle.connecting_units(job) >= job.workers
        ):
            return False
        # It fits once agents that are online connect their streams (seconds): it waits for them and
        # says so; it preempts nothing, and the free devices it will take are kept from later jobs.
        self.plan.waiting[job.job_id] = wait_reasons.connecting(job, [a.name for a in self.idle.connecting])
        tasks = place_gang(
            self.free.offer(without=self.blocked_for(job)) + self.idle.connecting,
            job.workers,
            job.gpus_per_worker,
            self.rng,
            job.memory_per_worker,
        )
        if isinstance(tasks, list):
            offered = {a.agent_id for a in self.inputs.offer}
            self.reservation = Reservation(
                job, devices_of([t for t in tasks if t.agent_id in offered]), self.now
            )
            self.reasons.clear()
            self.cache.clear()
        return True

    def preempt_for(self, job: WaitingJob) -> bool:
        """Decides a preemption for the job (a few per pass, none once a job holds the reservation)."""
        if self.reservation is not None or self.searches >= MAX_PREEMPTION_SEARCHES:
            return False
        candidates = [r for r in self.preemptable.values() if r.kind == job.kind and may_preempt(job, r)]
        if not candidates:
            return False
        self.searches += 1
        decision = choose_victims(job, candidates, self.free, self.held_all, self.rng, self.now)
        if decision is None:
            return False
        self.plan.preemptions.append(decision)
        for victim in decision.victims:
            self.preemptable.pop(victim.job_id, None)
        self.holds[job.job_id] = {a: set(d) for a, d in decision.hold.items()}
        self.held_all = merge(self.held_all, self.holds[job.job_id])
        self.cache.clear()
        self.reasons.clear()
        victims = [v.job_id for v in decision.victims]
        self.plan.waiting[job.job_id] = wait_reasons.preempting_for(job, victims)
        return True

    def reserve_for(self, job: WaitingJob) -> bool:
        """Gives the job the reservation (the first few blocked jobs try, until one gets it)."""
        if self.reservation is not None or self.reservation_tries >= MAX_RESERVATION_TRIES:
            return False
        self.reservation_tries += 1
        self.reservation = reserve(job, self.free, self.held_all, self.inputs.running, self.now, self.rng)
        if self.reservation is None:
            return False
        self.reasons.clear()
        self.cache.clear()
        self.plan.waiting[job.job_id] = wait_reasons.reserved_head(job, self.reservation.starts_at)
        return True


def _placed(
    plan: Plan,
    free: Free,
    usage: dict[str, dict[str, int]],
    job: WaitingJob,
    tasks: list[TaskPlacement],
    borrowed: bool,
) -> None:
    plan.placements.append(Placement(job, tasks, borrowed))
    free.take(tasks)
    used = usage.setdefault(job.team, {})
    used[job.kind] = used.get(job.kind, 0) + job.need


def _blocked_reason(
    job: WaitingJob,
    free: Free,
    held_all: Mapping[str, set[int]],
    idle: Idle,
    reservation: Reservation | None,
    holds: Mapping[str, Mapping[str, set[int]]],
) -> dict[str, Any]:
    """Why a job that does not fit waits: held for a preemptor, reserved for the head, cordons, or no fit
    (its memory, when the free devices would hold it)."""
    bare = free.units(job.kind, job.per_worker, memory=job.memory_per_worker)
    if bare >= job.workers:
        if reservation is not None and reservation.job.job_id != job.job_id:
            return wait_reasons.reserved_for(job, reservation.job.job_id)
        ahead = next((j for j, d in holds.items() if j != job.job_id and any(d.values())), None)
        if ahead is not None:
            return wait_reasons.behind_priority(job, ahead)
    if bare < job.workers <= bare + idle.cordoned_units(job):
        return wait_reasons.cordoned(job)
    if bare < job.workers <= bare + idle.connecting_units(job):
        return wait_reasons.connecting(job, [a.name for a in idle.connecting])
    never = idle.never(job)
    short_of_memory = (
        not never and job.memory_per_worker > 0 and free.units(job.kind, job.per_worker) >= job.workers
    )
    return wait_reasons.no_fit(job, never, short_of_memory=short_of_memory)
