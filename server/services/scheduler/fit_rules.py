"""Whether a job's gang could ever fit a set of agents, were they all idle: the one rule behind the refusal
at submit (services/scheduler/submit_capacity.py, over every registered agent) and the reason a waiting job gets in
the queue (services/scheduler/placement.py `never_fits`, over the online ones). Each phrases the answer for its
moment; the rule is decided here once.

A worker takes G GPUs, or one CPU slot when G is 0, and its memory_per_worker of the memory its agent
offers its tasks. An agent that did not report its memory (0) is taken to hold any. Pure functions over
plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


def devices_needed(gpus_per_worker: int) -> tuple[str, int]:
    """The device kind and count one task takes: G GPUs, or one CPU slot when G is 0."""
    return ("gpu", gpus_per_worker) if gpus_per_worker > 0 else ("cpu", 1)


def workers_fitting(
    free_devices: int, per_worker: int, memory_free: int | None, memory_per_worker: int
) -> int:
    """Workers of a shape one agent holds: by `free_devices`, and by its memory when both are known."""
    by_devices = free_devices // per_worker
    if memory_per_worker <= 0 or memory_free is None:
        return by_devices
    return min(by_devices, memory_free // memory_per_worker)


@dataclass(frozen=True)
class AgentShape:
    """What an agent would offer when idle: its device kind and count and the memory for its tasks."""

    name: str
    kind: str  # "gpu" or "cpu"
    devices: int
    memory_bytes: int = 0  # 0: not reported

    def workers(self, per_worker: int, memory_per_worker: int) -> int:
        """Workers of this shape it holds when idle."""
        memory = self.memory_bytes if self.memory_bytes > 0 else None
        return workers_fitting(self.devices, per_worker, memory, memory_per_worker)


class Rule(Enum):
    """Which part of the rule a job breaks, in the order they are checked."""

    NO_AGENT_OF_KIND = "no agent offers the device kind"
    DEVICES_PER_AGENT = "no agent has the devices of one worker"
    DEVICES_IN_ALL = "all agents together hold too few workers"
    MEMORY_PER_AGENT = "no agent offers the memory of one worker"
    MEMORY_IN_ALL = "all agents' memory together holds too few workers"


@dataclass(frozen=True)
class Misfit:
    """Why a gang never fits: the rule broken and the figures a reason quotes."""

    rule: Rule
    kind: str
    per_worker: int  # devices one worker takes
    candidates: tuple[AgentShape, ...]  # the agents of the kind (none for NO_AGENT_OF_KIND)
    largest: AgentShape | None = None  # by devices, or by memory for MEMORY_PER_AGENT
    most: int = 0  # the workers the candidates hold at most when idle (the *_IN_ALL rules)


def never_fits(
    agents: Sequence[AgentShape], workers: int, gpus_per_worker: int, memory_per_worker: int = 0
) -> Misfit | None:
    """Why `workers` workers of this shape could not fit `agents` even were every one idle; None when
    they could."""
    kind, per_worker = devices_needed(gpus_per_worker)
    candidates = tuple(a for a in agents if a.kind == kind)
    if not candidates:
        return Misfit(Rule.NO_AGENT_OF_KIND, kind, per_worker, ())
    largest = max(candidates, key=lambda a: a.devices)
    if largest.devices < per_worker:
        return Misfit(Rule.DEVICES_PER_AGENT, kind, per_worker, candidates, largest)
    most = sum(a.devices // per_worker for a in candidates)
    if most < workers:
        return Misfit(Rule.DEVICES_IN_ALL, kind, per_worker, candidates, largest, most)
    if memory_per_worker <= 0:
        return None
    if all(a.memory_bytes > 0 for a in candidates):
        roomiest = max(candidates, key=lambda a: (a.memory_bytes, a.name))
        if roomiest.memory_bytes < memory_per_worker:
            return Misfit(Rule.MEMORY_PER_AGENT, kind, per_worker, candidates, roomiest)
    most = sum(a.workers(per_worker, memory_per_worker) for a in candidates)
    if most < workers:
        return Misfit(Rule.MEMORY_IN_ALL, kind, per_worker, candidates, largest, most)
    return None
