"""One scheduler pass decided over plain data: what to place, what to preempt, and why the rest wait.

Pure (server/services/scheduler/scheduling.py reads the data and applies the plan), so every rule is tested
without a database:

- **Order**: queue_order.py (priority, fair share, age).
- **Memory**: a job's memory_per_worker counts against each agent's memory as its devices do
  (placement.py); running jobs free theirs when they end or are preempted, as their devices.
- **Quotas**: a job that would take its team over quota waits (over_quota), unless it is preemptible
  and the capacity is idle: then it borrows, and is the first to be reclaimed.
- **Reservation and backfill** (EASY backfill): the first job in the order that does not fit gets a
  reservation: the devices that free soonest (running jobs end at `started + max_runtime`; a job
  without one never ends), and the time they do. Jobs after it are placed only on devices the
  reservation does not need, or on reserved ones when their own max_runtime ends before it starts.
- **Connecting agents**: a job that fits once agents that are online but not connected yet have connected
  (a fraction of a second after a registration, or a coordinator start's reconnect grace) waits for them
  with that reason: it neither preempts nor takes the reservation.
- **Preemption**: a job that does not fit, within its team's quota, may preempt preemptible jobs of
  lower priority, or other teams' borrowed jobs: whole gangs, the fewest devices·seconds lost. The
  devices freed (and the free ones it needs) are held for it until its victims have exited.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from mwms.server.services.scheduler import wait_reasons
from mwms.server.services.scheduler.placement import (
    AgentCapacity,
    NoFit,
    TaskPlacement,
    fitting_now,
    never_fits,
    place_gang,
    place_pinned,
    workers_fitting,
)
from mwms.server.services.scheduler.queue_order import WaitingJob

# Blocked jobs per pass that may look for victims, and that may try for the reservation (one whose gang
# could not fit even on an idle cluster gets none): each is a few placement tries.
MAX_PREEMPTION_SEARCHES = 3
MAX_RESERVATION_TRIES = 3


@dataclass(frozen=True)
class RunningJob:
    """A placed job whose tasks hold devices."""

    job_id: str
    priority: int
    team: str
    kind: str
    devices: Mapping[str, tuple[int, ...]]  # agent_id -> device indices its tasks hold
    started_at: datetime
    ends_at: datetime | None  # None: no max_runtime, never ends as far as planning knows
    borrowed: bool = False
    # May be preempted now: preemptible, RUNNING, past the minimum run time, under the hourly cap.
    preemptable: bool = False
    grace_s: int = 30
    memory: Mapping[str, int] = field(default_factory=dict)  # agent_id -> memory_per_worker its tasks hold

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.devices.values())


@dataclass(frozen=True)
class Placement:
    job: WaitingJob
    tasks: list[TaskPlacement]
    borrowed: bool


@dataclass(frozen=True)
class PreemptionDecision:
    preemptor: WaitingJob
    victims: list[RunningJob]
    cause: str  # "priority" or "reclaim"
    hold: dict[str, tuple[int, ...]]
    hold_s: int  # how long the hold lasts: the victims' longest grace plus a margin


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


class _Free:
    """Free devices, used ports and promised memory per agent, updated as the pass places jobs."""

    def __init__(self, agents: Sequence[AgentCapacity]) -> None:
        self.agents = {a.agent_id: a for a in agents}
        # Copied for an agent only when the pass places on it: most agents are only read.
        self.free: dict[str, frozenset[int] | set[int]] = {
            a.agent_id: frozenset(a.free_devices) for a in agents
        }
        self.ports: dict[str, frozenset[int] | set[int]] = {a.agent_id: a.used_ports for a in agents}
        self.memory_used: dict[str, int] = {a.agent_id: a.memory_used for a in agents}
        self.version = 0

    def take(self, tasks: Sequence[TaskPlacement]) -> None:
        for t in tasks:
            self.free[t.agent_id] = set(self.free[t.agent_id]) - set(t.device_indices)
            self.ports[t.agent_id] = set(self.ports[t.agent_id]) | {t.port}
            self.memory_used[t.agent_id] += t.memory_bytes
        self.version += 1

    def memory_free(self, agent_id: str, freeing: int = 0) -> int | None:
        """Memory of the agent not promised to tasks (less `freeing`'s); None when it reported none."""
        offered = self.agents[agent_id].memory_bytes
        return max(0, offered - max(0, self.memory_used[agent_id] - freeing)) if offered > 0 else None

    def offer(
        self,
        without: Mapping[str, set[int]] | None = None,
        adding: Mapping[str, set[int]] | None = None,
        freeing: Mapping[str, int] | None = None,
    ) -> list[AgentCapacity]:
        """The agents as AgentCapacity with what is free, less `without`, plus `adding` (devices) and
        `freeing` (memory of jobs that would end)."""
        result = []
        for agent_id, agent in self.agents.items():
            free = set(self.free[agent_id])
            if adding and agent_id in adding:
                free |= adding[agent_id] & set(agent.all_devices)
            if without and agent_id in without:
                free -= without[agent_id]
            used = max(0, self.memory_used[agent_id] - (freeing or {}).get(agent_id, 0))
            result.append(
                replace(
                    agent,
                    free_devices=tuple(sorted(free)),
                    used_ports=frozenset(self.ports[agent_id]),
                    memory_used=used,
                )
            )
        return result

    def units(
        self, kind: str, per_worker: int, without: Mapping[str, set[int]] | None = None, memory: int = 0
    ) -> int:
        """Workers of this shape (asking `memory` each) that fit on what is free, less `without`, counted
        without building offers."""
        total = 0
        for agent_id, free in self.free.items():
            if self.agents[agent_id].device_kind != kind:
                continue
            devices = len(free - without[agent_id]) if without and agent_id in without else len(free)
            if memory > 0:
                total += workers_fitting(devices, per_worker, self.memory_free(agent_id), memory)
            else:
                total += devices // per_worker
        return total


def _units(offer: Sequence[AgentCapacity], kind: str, per_worker: int, memory: int = 0) -> int:
    """How many workers of this shape (asking `memory` each) fit on `offer` now."""
    return sum(fitting_now(a, per_worker, memory) for a in offer if a.device_kind == kind)


def _merge(*parts: Mapping[str, set[int]]) -> dict[str, set[int]]:
    merged: dict[str, set[int]] = {}
    for part in parts:
        for agent_id, devices in part.items():
            merged.setdefault(agent_id, set()).update(devices)
    return merged


def _devices_of(tasks: Sequence[TaskPlacement]) -> dict[str, set[int]]:
    return _merge(*({t.agent_id: set(t.device_indices)} for t in tasks))


@dataclass
class _Reservation:
    job: WaitingJob
    devices: dict[str, set[int]]
    starts_at: datetime | None  # None: not before a job without max_runtime ends


def plan_pass(inputs: PlanInputs) -> Plan:
    """Decides the pass (see the module docstring)."""
    now, rng = inputs.now, inputs.rng or random.Random()
    plan = Plan()
    free = _Free(inputs.offer)
    holds = {j.job_id: {a: set(d) for a, d in j.hold.items()} for j in inputs.order if j.hold}
    held_all = _merge(*holds.values())
    usage = {team: dict(used) for team, used in inputs.usage.items()}
    preemptable = {r.job_id: r for r in inputs.running if r.preemptable}
    reservation: _Reservation | None = None
    searches = 0
    cache: dict[tuple[Any, ...], int] = {}

    def blocked_for(job: WaitingJob) -> dict[str, set[int]]:
        """What the job may not use: others' holds, and the reservation unless it is its own or it backfills."""
        own = holds.get(job.job_id, {})
        blocked = {a: d - own.get(a, set()) for a, d in held_all.items()}
        if (
            reservation is not None
            and reservation.job.job_id != job.job_id
            and not _ends_before(job, reservation, now)
        ):
            blocked = _merge(blocked, reservation.devices)
        return blocked

    def plain_units(job: WaitingJob) -> int:
        key = (free.version, job.kind, job.per_worker, job.memory_per_worker)
        if key not in cache:
            cache[key] = free.units(job.kind, job.per_worker, held_all, job.memory_per_worker)
        return cache[key]

    def units_for(job: WaitingJob, own_hold: bool) -> int:
        """Workers of the job's shape its offer holds; cached for the common case (no hold, no backfill)."""
        if own_hold or reservation is None or _ends_before(job, reservation, now):
            return free.units(job.kind, job.per_worker, blocked_for(job), job.memory_per_worker)
        key = (free.version, job.kind, job.per_worker, job.memory_per_worker, -1)
        if key not in cache:
            cache[key] = free.units(job.kind, job.per_worker, blocked_for(job), job.memory_per_worker)
        return cache[key]

    reservation_tries = 0
    reasons: dict[tuple[Any, ...], dict[str, Any]] = {}
    idle = _Idle(inputs.offer, inputs.cordoned, inputs.connecting)

    def blocked(job: WaitingJob) -> dict[str, Any]:
        key = (free.version, len(held_all), job.kind, job.per_worker, job.workers, job.memory_per_worker)
        if key not in reasons:
            reasons[key] = _blocked_reason(job, free, held_all, idle, reservation, holds)
        return reasons[key]

    for job in inputs.order:
        if job.state != "PENDING":
            plan.waiting[job.job_id] = wait_reasons.not_placeable(job.state)
            continue
        in_use = usage.get(job.team, {}).get(job.kind, 0)
        limit = inputs.quotas.get(job.team, {}).get(job.kind)
        over_quota = limit is not None and in_use + job.need > limit
        if over_quota and limit is not None and not job.preemptible:
            plan.waiting[job.job_id] = wait_reasons.over_quota(job, in_use, limit, borrowable=False)
            continue
        if job.pinned:
            pinned = place_pinned(
                free.offer(without=blocked_for(job)),
                list(job.pinned),
                job.gpus_per_worker,
                rng,
                known=inputs.known_agents or None,
                memory_per_worker=job.memory_per_worker,
            )
            if isinstance(pinned, NoFit):
                plan.waiting[job.job_id] = wait_reasons.pinned(pinned.reason)
            else:
                _placed(plan, free, usage, job, pinned, borrowed=over_quota)
            continue
        own_hold = job.job_id in holds
        if (own_hold or plain_units(job) >= job.workers) and units_for(job, own_hold) >= job.workers:
            tasks = place_gang(
                free.offer(without=blocked_for(job)),
                job.workers,
                job.gpus_per_worker,
                rng,
                job.memory_per_worker,
            )
            if isinstance(tasks, list):
                _placed(plan, free, usage, job, tasks, borrowed=over_quota)
                continue
        if over_quota and limit is not None:
            # Borrowing takes idle capacity only: it never preempts and never reserves.
            plan.waiting[job.job_id] = wait_reasons.over_quota(job, in_use, limit, borrowable=True)
            continue
        if own_hold:
            plan.waiting[job.job_id] = wait_reasons.preempting_for(job)
            continue
        if (
            reservation is None
            and idle.connecting
            and units_for(job, own_hold) + idle.connecting_units(job) >= job.workers
        ):
            # It fits once agents that are online connect their streams (seconds): it waits for them and
            # says so; it preempts nothing, and the free devices it will take are kept from later jobs.
            plan.waiting[job.job_id] = wait_reasons.connecting(job, [a.name for a in idle.connecting])
            tasks = place_gang(
                free.offer(without=blocked_for(job)) + idle.connecting,
                job.workers,
                job.gpus_per_worker,
                rng,
                job.memory_per_worker,
            )
            if isinstance(tasks, list):
                offered = {a.agent_id for a in inputs.offer}
                reservation = _Reservation(job, _devices_of([t for t in tasks if t.agent_id in offered]), now)
                reasons.clear()
                cache.clear()
            continue
        if reservation is None and searches < MAX_PREEMPTION_SEARCHES:
            candidates = [r for r in preemptable.values() if r.kind == job.kind and _may_preempt(job, r)]
            if candidates:
                searches += 1
                decision = _choose_victims(job, candidates, free, held_all, rng, now)
                if decision is not None:
                    plan.preemptions.append(decision)
                    for victim in decision.victims:
                        preemptable.pop(victim.job_id, None)
                    holds[job.job_id] = {a: set(d) for a, d in decision.hold.items()}
                    held_all = _merge(held_all, holds[job.job_id])
                    cache.clear()
                    reasons.clear()
                    victims = [v.job_id for v in decision.victims]
                    plan.waiting[job.job_id] = wait_reasons.preempting_for(job, victims)
                    continue
        if reservation is None and reservation_tries < MAX_RESERVATION_TRIES:
            reservation_tries += 1
            reservation = _reserve(job, free, held_all, inputs.running, now, rng)
            if reservation is not None:
                reasons.clear()
                cache.clear()
                plan.waiting[job.job_id] = wait_reasons.reserved_head(job, reservation.starts_at)
                continue
        plan.waiting[job.job_id] = blocked(job)
    return plan


def _placed(
    plan: Plan,
    free: _Free,
    usage: dict[str, dict[str, int]],
    job: WaitingJob,
    tasks: list[TaskPlacement],
    borrowed: bool,
) -> None:
    plan.placements.append(Placement(job, tasks, borrowed))
    free.take(tasks)
    used = usage.setdefault(job.team, {})
    used[job.kind] = used.get(job.kind, 0) + job.need


def _ends_before(job: WaitingJob, reservation: _Reservation, now: datetime) -> bool:
    """Backfill: the job's own max_runtime ends before the reservation starts."""
    if job.max_runtime_s is None:
        return False
    if reservation.starts_at is None:
        return True
    return now + timedelta(seconds=job.max_runtime_s) <= reservation.starts_at


def _may_preempt(job: WaitingJob, victim: RunningJob) -> bool:
    """Lower priority, or another team's borrowed job while the preemptor's team is within its quota."""
    if victim.priority < job.priority:
        return True
    return victim.borrowed and victim.team != job.team


def _cause(job: WaitingJob, victims: Sequence[RunningJob]) -> str:
    return "priority" if all(v.priority < job.priority for v in victims) else "reclaim"


def _choose_victims(
    job: WaitingJob,
    candidates: list[RunningJob],
    free: _Free,
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
        adding = _merge(*({a: set(d) for a, d in v.devices.items()} for v in victims))
        freeing: dict[str, int] = {}
        for victim in victims:
            for agent_id, memory in victim.memory.items():
                freeing[agent_id] = freeing.get(agent_id, 0) + memory
        offer = free.offer(without=held, adding=adding, freeing=freeing)
        if _units(offer, job.kind, job.per_worker, job.memory_per_worker) < job.workers:
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
        hold={a: tuple(sorted(d)) for a, d in _devices_of(tasks).items()},
        hold_s=max(v.grace_s for v in chosen) + 30,
    )


def _reserve(
    job: WaitingJob,
    free: _Free,
    held: Mapping[str, set[int]],
    running: Sequence[RunningJob],
    now: datetime,
    rng: random.Random,
) -> _Reservation | None:
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
        replace(
            agent,
            free_devices=tuple(sorted(sim[a])),
            memory_used=max(0, free.memory_used[a] - freed[a]),
        )
        for a, agent in free.agents.items()
    ]
    tasks = place_gang(offer, job.workers, job.gpus_per_worker, rng, job.memory_per_worker)
    if not isinstance(tasks, list):
        return None
    return _Reservation(job, _devices_of(tasks), starts_at)


class _Idle:
    """What the cluster offers when nothing runs, and what cordoned agents add: fixed for a pass."""

    def __init__(
        self,
        offer: Sequence[AgentCapacity],
        cordoned: Sequence[AgentCapacity],
        connecting: Sequence[AgentCapacity] = (),
    ) -> None:
        self.offer = list(offer)
        self.cordoned = list(cordoned)
        self.connecting = list(connecting)
        self._never: dict[tuple[str, int, int, int], str] = {}

    def never(self, job: WaitingJob) -> str:
        """place_gang's own explanation when the job could not fit even on an idle cluster, else ''."""
        key = (job.kind, job.per_worker, job.workers, job.memory_per_worker)
        if key not in self._never:
            result = never_fits(self.offer, job.workers, job.gpus_per_worker, job.memory_per_worker)
            self._never[key] = result.reason if result is not None else ""
        return self._never[key]

    def cordoned_units(self, job: WaitingJob) -> int:
        return _units(self.cordoned, job.kind, job.per_worker, job.memory_per_worker)

    def connecting_units(self, job: WaitingJob) -> int:
        return _units(self.connecting, job.kind, job.per_worker, job.memory_per_worker)


def _blocked_reason(
    job: WaitingJob,
    free: _Free,
    held_all: Mapping[str, set[int]],
    idle: _Idle,
    reservation: _Reservation | None,
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
