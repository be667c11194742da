"""What one scheduler pass places on (server/services/scheduler/queue_plan.py): the free devices, used
ports and promised memory per agent, updated as the pass places jobs; and the idle cluster (what it
offers when nothing runs, and what cordoned and connecting agents add), fixed for a pass.

- **Memory**: a job's memory_per_worker counts against each agent's memory as its devices do
  (placement.py); running jobs free theirs when they end or are preempted, as their devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mwms.server.services.scheduler.fit_rules import AgentShape
from mwms.server.services.scheduler.placement import (
    AgentCapacity,
    TaskPlacement,
    agent_shapes,
    fitting_now,
    never_fits,
    workers_fitting,
)
from mwms.server.services.scheduler.queue_order import WaitingJob


class Free:
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
        self._units: dict[tuple[int, str, int, int], int] = {}  # units() of all that is free, by version

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
            result.append(changed(agent, tuple(sorted(free)), self.ports[agent_id], used))
        return result

    def units(
        self, kind: str, per_worker: int, without: Mapping[str, set[int]] | None = None, memory: int = 0
    ) -> int:
        """Workers of this shape (asking `memory` each) that fit on what is free, less `without`, counted
        without building offers (kept until the next take when nothing is left out)."""
        whole = (self.version, kind, per_worker, memory) if not without else None
        if whole is not None and whole in self._units:
            return self._units[whole]
        total = 0
        for agent_id, free in self.free.items():
            if self.agents[agent_id].device_kind != kind:
                continue
            devices = len(free - without[agent_id]) if without and agent_id in without else len(free)
            if memory > 0:
                total += workers_fitting(devices, per_worker, self.memory_free(agent_id), memory)
            else:
                total += devices // per_worker
        if whole is not None:
            self._units[whole] = total
        return total


def changed(
    agent: AgentCapacity, free: tuple[int, ...], ports: frozenset[int] | set[int], memory_used: int
) -> AgentCapacity:
    """The agent with these free devices, used ports and used memory: itself when they are its own (most
    agents, in a pass over thousands: a copy each is most of an offer's cost)."""
    if free == agent.free_devices and ports is agent.used_ports and memory_used == agent.memory_used:
        return agent
    return agent.in_use(free, frozenset(ports), memory_used)


def units(offer: Sequence[AgentCapacity], kind: str, per_worker: int, memory: int = 0) -> int:
    """How many workers of this shape (asking `memory` each) fit on `offer` now."""
    return sum(fitting_now(a, per_worker, memory) for a in offer if a.device_kind == kind)


def merge(*parts: Mapping[str, set[int]]) -> dict[str, set[int]]:
    merged: dict[str, set[int]] = {}
    for part in parts:
        for agent_id, devices in part.items():
            merged.setdefault(agent_id, set()).update(devices)
    return merged


def devices_of(tasks: Sequence[TaskPlacement]) -> dict[str, set[int]]:
    return merge(*({t.agent_id: set(t.device_indices)} for t in tasks))


class Idle:
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
        self._shapes: list[AgentShape] | None = None  # the offer as never_fits sees it, built once

    def never(self, job: WaitingJob) -> str:
        """place_gang's own explanation when the job could not fit even on an idle cluster, else ''."""
        key = (job.kind, job.per_worker, job.workers, job.memory_per_worker)
        if key not in self._never:
            if self._shapes is None:
                self._shapes = agent_shapes(self.offer)
            result = never_fits(
                self.offer, job.workers, job.gpus_per_worker, job.memory_per_worker, shapes=self._shapes
            )
            self._never[key] = result.reason if result is not None else ""
        return self._never[key]

    def cordoned_units(self, job: WaitingJob) -> int:
        return units(self.cordoned, job.kind, job.per_worker, job.memory_per_worker)

    def connecting_units(self, job: WaitingJob) -> int:
        return units(self.connecting, job.kind, job.per_worker, job.memory_per_worker)
