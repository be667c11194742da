"""The scheduler's invariant, checked after every pass: no job waits unexplained beside devices that fit it.

Checked on the pass's own read (so nothing that changed since can make it cry wolf), apart from the
planner's rules: the schedulable capacity is every online agent that is not cordoned, whether or not its
stream is connected here yet (the offer plus the connecting agents), less what the pass placed and the
devices held for preemptors. A PENDING job the pass left waiting (pinned jobs aside: they wait for their
own agents) that fits there breaks the invariant unless its reason says why it may not take them:

- over_quota: its team's quota;
- reserved / head of a reservation that does not fit: the capacity is reserved for the first job in line;
- behind_priority, preempting: held for a job whose victims are exiting;
- connecting: it fits only once agents that are online have connected their streams.

A `no_fit` or `head` job that fits is a planner bug; so is a job that fits only with connecting agents
but is told anything else (it would wait, unexplained, for as long as they do not connect).
Each violation is logged with what the pass saw and counted in mwms_scheduler_invariant_violations_total;
with MWMS_SCHEDULER_STRICT_CHECK=1 (the test suite sets it) the pass fails instead.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from mwms.server.services.scheduler.placement import AgentCapacity, fitting_now, place_gang
from mwms.server.services.scheduler.queue_order import WaitingJob
from mwms.server.services.scheduler.queue_plan import Plan, PlanInputs

log = logging.getLogger("mwms.server.scheduling")
# Reasons that name what keeps a fitting job back.
HELD_BACK = frozenset({"over_quota", "reserved", "behind_priority", "preempting"})
STRICT_ENV = "MWMS_SCHEDULER_STRICT_CHECK"
VIOLATIONS = Counter(
    "mwms_scheduler_invariant_violations",
    "Jobs a scheduler pass left waiting, unexplained, beside free schedulable devices that fit them (a bug: "
    "the coordinator's log names the job and what the pass saw)",
)
# Violations described per pass at most (the count covers all).
MAX_LOGGED = 5


@dataclass(frozen=True)
class Violation:
    job_id: str
    reason_kind: str | None
    reason: str
    fits_on_offer: bool  # on the pass's own offer: the planner's rules went wrong
    unoffered: tuple[str, ...]  # names of agents it needed that were online but not offered (connecting)

    def describe(self) -> str:
        where = (
            "on the devices the pass offered"
            if self.fits_on_offer
            else f"once agents online but not offered are counted ({', '.join(self.unoffered[:8])})"
        )
        return (
            f"job {self.job_id} waits beside free devices that fit it {where}; its reason "
            f"({self.reason_kind}): {self.reason!r}"
        )


class SchedulerInvariantError(AssertionError):
    """A pass broke the invariant while MWMS_SCHEDULER_STRICT_CHECK was set."""


def _free_after(
    agents: Iterable[AgentCapacity], plan: Plan, held: Mapping[str, set[int]]
) -> list[AgentCapacity]:
    """`agents` less the devices, ports and memory the plan's placements took, and less held devices."""
    taken: dict[str, set[int]] = {}
    ports: dict[str, set[int]] = {}
    memory: dict[str, int] = {}
    for placement in plan.placements:
        for t in placement.tasks:
            taken.setdefault(t.agent_id, set()).update(t.device_indices)
            ports.setdefault(t.agent_id, set()).add(t.port)
            memory[t.agent_id] = memory.get(t.agent_id, 0) + t.memory_bytes
    result = []
    for agent in agents:
        gone = taken.get(agent.agent_id, set()) | held.get(agent.agent_id, set())
        if not gone and agent.agent_id not in ports:
            result.append(agent)
            continue
        result.append(
            agent.in_use(
                tuple(d for d in agent.free_devices if d not in gone),
                agent.used_ports | frozenset(ports.get(agent.agent_id, set())),
                agent.memory_used + memory.get(agent.agent_id, 0),
            )
        )
    return result


class _Capacity:
    """Agents as a pass left them, with the workers of each shape they hold counted once per shape."""

    def __init__(self, agents: list[AgentCapacity]) -> None:
        self.agents = agents
        self._units: dict[tuple[str, int, int], int] = {}

    def fits(self, job: WaitingJob) -> list[str] | None:
        """The agents a placement of `job` would use, or None when it does not fit."""
        key = (job.kind, job.per_worker, job.memory_per_worker)
        if key not in self._units:
            self._units[key] = sum(
                fitting_now(a, job.per_worker, job.memory_per_worker)
                for a in self.agents
                if a.device_kind == job.kind
            )
        if self._units[key] < job.workers:
            return None
        tasks = place_gang(
            self.agents, job.workers, job.gpus_per_worker, random.Random(0), job.memory_per_worker
        )
        return sorted({t.agent_id for t in tasks}) if isinstance(tasks, list) else None


def violations(inputs: PlanInputs, plan: Plan) -> list[Violation]:
    """The jobs `plan` leaves waiting against the invariant (see the module docstring)."""
    placed = {p.job.job_id for p in plan.placements}
    held: dict[str, set[int]] = {}
    for job in inputs.order:
        for agent_id, devices in (job.hold or {}).items():
            held.setdefault(agent_id, set()).update(devices)
    for decision in plan.preemptions:
        for agent_id, devices in decision.hold.items():
            held.setdefault(agent_id, set()).update(devices)
    offered_now = _free_after(inputs.offer, plan, held)
    offer = _Capacity(offered_now)
    everything = _Capacity(offered_now + _free_after(inputs.connecting, plan, held))
    names = {a.agent_id: a.name for a in everything.agents}
    offered = {a.agent_id for a in inputs.offer}
    found: list[Violation] = []
    seen: dict[tuple[Any, ...], tuple[bool, list[str] | None]] = {}
    for job in inputs.order:
        if job.state != "PENDING" or job.pinned or job.job_id in placed:
            continue
        reason = plan.waiting.get(job.job_id) or {}
        kind = reason.get("kind")
        if kind in HELD_BACK:
            continue  # the reason names the quota, reservation or hold that keeps it
        known = seen.get(job.fit)  # by its fit: the shape, and a max_runtime that does not matter here
        if known is None:
            placed_on = offer.fits(job)
            known = seen[job.fit] = (placed_on is not None, placed_on or everything.fits(job))
        fits_offer, agents = known
        if agents is None or (kind == "connecting" and not fits_offer):
            continue  # fits nowhere, or only once agents connect, which its reason says
        unoffered = tuple(names[a] for a in agents if a not in offered)
        found.append(Violation(job.job_id, kind, str(reason.get("message", "")), fits_offer, unoffered))
    return found


def check(inputs: PlanInputs, plan: Plan) -> list[Violation]:
    """Checks a pass's plan: logs and counts violations; raises SchedulerInvariantError when strict."""
    found = violations(inputs, plan)
    if not found:
        return found
    VIOLATIONS.inc(len(found))
    described = "; ".join(v.describe() for v in found[:MAX_LOGGED])
    more = f" (and {len(found) - MAX_LOGGED} more)" if len(found) > MAX_LOGGED else ""
    log.error("scheduler invariant broken: %s%s", described, more)
    if os.environ.get(STRICT_ENV) == "1":
        raise SchedulerInvariantError(described + more)
    return found
