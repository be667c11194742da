"""Gang placement: every task of an attempt placed at once, or none, with equal devices per task.

A job's memory_per_worker counts against each agent's memory as its devices do: the memory_per_worker of
the tasks an agent holds, plus the new one's, stays within what the agent offers its tasks (memory_bytes).
An agent that did not report its memory (0) is only not checked.

Pure functions over plain data, so the rules are tested without a database.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mwms.agent_references import AmbiguousAgent, UnknownAgent, resolve_agent_reference
from mwms.server.services.scheduler import fit_rules
from mwms.server.services.scheduler.fit_rules import AgentShape, Misfit, Rule, devices_needed, workers_fitting
from mwms.server.services.wording import count as wcount
from mwms.server.services.wording import listed
from mwms.sizes import format_size


@dataclass(frozen=True)
class AgentCapacity:
    """What one online agent can offer right now."""

    agent_id: str
    name: str
    address: str
    device_kind: str  # "gpu" or "cpu"
    all_devices: tuple[int, ...]
    free_devices: tuple[int, ...]
    port_low: int
    port_high: int
    used_ports: frozenset[int] = field(default_factory=frozenset)
    memory_bytes: int = 0  # what it offers its tasks in all; 0: not reported (not checked)
    memory_used: int = 0  # the memory_per_worker of the tasks that hold its devices

    @property
    def memory_free(self) -> int | None:
        """Memory not yet promised to its tasks; None when the agent did not report its memory."""
        return max(0, self.memory_bytes - self.memory_used) if self.memory_bytes > 0 else None

    def in_use(self, free: tuple[int, ...], ports: frozenset[int], memory_used: int) -> AgentCapacity:
        """This agent with these free devices, used ports and used memory. A pass makes a thousand of
        these (the reservation's idle cluster, the invariant check): its fields are copied as they are,
        where dataclasses.replace ran the frozen __init__ again (5x the time)."""
        copy = object.__new__(AgentCapacity)
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields["free_devices"], fields["used_ports"], fields["memory_used"] = free, ports, memory_used
        return copy


@dataclass(frozen=True)
class TaskPlacement:
    index: int
    agent_id: str
    address: str
    port: int
    device_kind: str
    device_indices: tuple[int, ...]
    memory_bytes: int = 0  # the job's memory_per_worker (0: none asked), counted against its agent

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"


@dataclass(frozen=True)
class NoFit:
    """Why a job cannot be placed, phrased so a person can act on it."""

    reason: str


def memory_fits(free: int | None, memory_per_worker: int) -> bool:
    """Whether one more worker asking `memory_per_worker` (0: none) fits in `free` (None: not reported)."""
    return memory_per_worker <= 0 or free is None or free >= memory_per_worker


def fitting_now(agent: AgentCapacity, per_worker: int, memory_per_worker: int = 0) -> int:
    """Workers of a shape an agent can start now, on its free devices and memory."""
    return workers_fitting(len(agent.free_devices), per_worker, agent.memory_free, memory_per_worker)


# How much of a co-location note lists: the workers of one agent, and the agents.
NOTE_WORKERS = 4
NOTE_AGENTS = 3


def shared_agent_note(tasks: Iterable[TaskPlacement], names: Mapping[str, str]) -> str:
    """A note for a GPU job's SCHEDULED reason when two or more of its workers share an agent ("" when
    none do, and for CPU jobs): what they share there, and the shape MultiWorkerMirroredStrategy expects.

    Agents are named by `names` (agent id -> name; the id where absent); bounded whatever the gang's size.
    """
    by_agent: dict[str, list[int]] = {}
    gpus = 0
    for task in tasks:
        if task.device_kind != "gpu":
            return ""
        by_agent.setdefault(task.agent_id, []).append(task.index)
        gpus = len(task.device_indices)
    shared = sorted((sorted(indices), agent_id) for agent_id, indices in by_agent.items() if len(indices) > 1)
    if not shared:
        return ""
    groups = []
    for indices, agent_id in shared[:NOTE_AGENTS]:
        workers = listed([str(i) for i in indices], NOTE_WORKERS)
        groups.append(f"workers {workers} share agent {names.get(agent_id, agent_id)}")
    if len(shared) > NOTE_AGENTS:
        more = len(shared) - NOTE_AGENTS
        groups.append(f"{wcount(more, 'more agent')} {'holds' if more == 1 else 'hold'} several")
    per_agent = {len(indices) for indices in by_agent.values()}
    # The same agents as one worker each, when every agent holds as many workers as the others.
    shape = (
        f"--workers {len(by_agent)} --gpus-per-worker {per_agent.pop() * gpus}"
        if len(per_agent) == 1
        else "--workers <machines> --gpus-per-worker <N>"
    )
    return (
        f"; {', '.join(groups)}: they share the job's /dev/shm there (NCCL's shared-memory path), but "
        "MultiWorkerMirroredStrategy's usual shape is one worker per machine holding all its GPUs "
        f"({shape}), where MirroredStrategy uses NVLink inside the worker"
    )


def place_gang(
    agents: list[AgentCapacity],
    workers: int,
    gpus_per_worker: int,
    rng: random.Random | None = None,
    memory_per_worker: int = 0,
) -> list[TaskPlacement] | NoFit:
    """Places `workers` tasks, spreading them over the agents with the most free devices first; each
    agent takes only as many as its free memory holds when the job asks for memory."""
    rng = rng or random.Random()
    never = never_fits(agents, workers, gpus_per_worker, memory_per_worker)
    if never is not None:
        return never
    kind, count = devices_needed(gpus_per_worker)
    unit = "GPU" if kind == "gpu" else "CPU slot"
    candidates = [a for a in agents if a.device_kind == kind]

    free: dict[str, list[int]] = {a.agent_id: sorted(a.free_devices) for a in candidates}
    ports: dict[str, set[int]] = {a.agent_id: set(a.used_ports) for a in candidates}
    memory: dict[str, int | None] = {a.agent_id: a.memory_free for a in candidates}
    # Worst fit: each worker goes to the agent with the most free devices (ties by name), so workers
    # spread over machines. A heap keeps that choice O(log agents): an agent only loses devices, ports
    # and memory, so one that cannot take a worker now never can again in this placement.
    heap = [(-len(free[a.agent_id]), a.name, a.agent_id, a) for a in candidates]
    heapq.heapify(heap)
    placements: list[TaskPlacement] = []
    for index in range(workers):
        agent = None
        while heap:
            _, _, agent_id, candidate = heapq.heappop(heap)
            if (
                len(free[agent_id]) >= count
                and _has_free_port(candidate, ports)
                and memory_fits(memory[agent_id], memory_per_worker)
            ):
                agent = candidate
                break
        if agent is None:
            return _no_capacity(candidates, workers, count, unit, memory_per_worker)
        taken = tuple(free[agent.agent_id][:count])
        free[agent.agent_id] = free[agent.agent_id][count:]
        left = memory[agent.agent_id]
        if left is not None and memory_per_worker > 0:
            memory[agent.agent_id] = left - memory_per_worker
        port = _pick_port(agent, ports[agent.agent_id], rng)
        ports[agent.agent_id].add(port)
        placements.append(
            TaskPlacement(index, agent.agent_id, agent.address, port, kind, taken, max(0, memory_per_worker))
        )
        heapq.heappush(heap, (-len(free[agent.agent_id]), agent.name, agent.agent_id, agent))
    return placements


def _no_capacity(
    candidates: list[AgentCapacity], workers: int, count: int, unit: str, memory_per_worker: int
) -> NoFit:
    """Why a gang that fits an idle cluster waits: devices, or (when those would do) memory."""
    shape = f"{wcount(workers, 'worker')} × {wcount(count, unit)}"
    by_devices = sum(len(a.free_devices) // count for a in candidates)
    free_now = sum(fitting_now(a, count, memory_per_worker) for a in candidates)
    if memory_per_worker > 0 and free_now < workers <= by_devices:
        return NoFit(
            f"waiting for memory: needs {shape} and {format_size(memory_per_worker)} per worker; the free "
            f"devices are on agents whose memory is promised to running tasks, {free_now} can start now on "
            f"{wcount(len(candidates), 'online agent')}; it starts when running jobs finish or agents join"
        )
    return NoFit(
        f"waiting for capacity: needs {shape}, {free_now} can start now on "
        f"{wcount(len(candidates), 'online agent')}; it starts when running jobs finish or agents join"
    )


def never_fits(
    agents: list[AgentCapacity],
    workers: int,
    gpus_per_worker: int,
    memory_per_worker: int = 0,
    shapes: Sequence[AgentShape] | None = None,
) -> NoFit | None:
    """Why the gang could not fit the online agents even if every one were idle (services/scheduler/fit_rules.py),
    phrased for a waiting job; None when it could. `shapes`: agent_shapes(agents), when the caller keeps them."""
    if shapes is None:
        shapes = agent_shapes(agents)
    misfit = fit_rules.never_fits(shapes, workers, gpus_per_worker, memory_per_worker)
    return None if misfit is None else NoFit(_waiting_reason(misfit, workers, memory_per_worker))


def agent_shapes(agents: Sequence[AgentCapacity]) -> list[AgentShape]:
    """The agents as fit_rules sees them: kind, devices and memory."""
    return [AgentShape(a.name, a.device_kind, len(a.all_devices), a.memory_bytes) for a in agents]


def _waiting_reason(misfit: Misfit, workers: int, memory: int) -> str:
    unit = "GPU" if misfit.kind == "gpu" else "CPU slot"
    per_worker, candidates, largest = misfit.per_worker, misfit.candidates, misfit.largest
    agents = wcount(len(candidates), "online agent")
    if misfit.rule is Rule.NO_AGENT_OF_KIND:
        hint = (
            "start agents on GPU machines"
            if misfit.kind == "gpu"
            else "start an agent with --slots N, or ask for --gpus-per-worker"
        )
        return f"no online agent offers {unit}s; {hint}"
    assert largest is not None
    if misfit.rule is Rule.DEVICES_PER_AGENT:
        return (
            f"each worker needs {wcount(per_worker, unit)} but the largest agent ({largest.name}) has "
            f"{largest.devices}; lower --gpus-per-worker or add larger machines"
        )
    if misfit.rule is Rule.DEVICES_IN_ALL:
        return (
            f"needs {wcount(workers, 'worker')} × {wcount(per_worker, unit)} but the {agents} can hold at "
            f"most {wcount(misfit.most, 'such worker')} even when idle; add agents or lower --workers"
        )
    if misfit.rule is Rule.MEMORY_PER_AGENT:
        return (
            f"needs {format_size(memory)} per worker; the largest agent ({largest.name}) offers "
            f"{format_size(largest.memory_bytes)}: lower --memory-per-worker or add machines with more memory"
        )
    return (
        f"needs {wcount(workers, 'worker')} × {wcount(per_worker, unit)} and {format_size(memory)} per "
        f"worker, but the memory of the {agents} holds at most {wcount(misfit.most, 'such worker')} even "
        "when idle; add agents, or lower --workers or --memory-per-worker"
    )


def _has_free_port(agent: AgentCapacity, ports: dict[str, set[int]]) -> bool:
    return (agent.port_high - agent.port_low + 1) > len(ports[agent.agent_id])


def _pick_port(agent: AgentCapacity, used: set[int], rng: random.Random) -> int:
    # Random rather than lowest-first, so a port another program holds is unlikely to be picked twice.
    span = agent.port_high - agent.port_low + 1
    for _ in range(64):
        port = agent.port_low + rng.randrange(span)
        if port not in used:
            return port
    return next(p for p in range(agent.port_low, agent.port_high + 1) if p not in used)


def place_pinned(
    agents: list[AgentCapacity],
    wanted: list[str],
    gpus_per_worker: int,
    rng: random.Random | None = None,
    known: Iterable[tuple[str, str]] | None = None,
    memory_per_worker: int = 0,
) -> list[TaskPlacement] | NoFit:
    """Places worker i on the agent `wanted[i]` names (its id, else its name), or says which agent it waits for.

    `known`: (id, name) of every agent the pins could mean, offline ones too (agent_references.pin_candidates),
    so a pin resolves the same whether or not the agent it means is online; by default the offered agents.
    A pin that could mean two agents places nothing (mwms/agent_references.py).
    """
    rng = rng or random.Random()
    kind, count = devices_needed(gpus_per_worker)
    unit = "GPU" if kind == "gpu" else "CPU slot"
    directory = list(known) if known is not None else [(a.agent_id, a.name) for a in agents]
    offered = {a.agent_id: a for a in agents}
    resolved: list[str] = []
    missing: set[str] = set()
    for index, key in enumerate(wanted):
        try:
            agent_id = resolve_agent_reference(directory, key)
        except UnknownAgent:
            agent_id = ""
        except AmbiguousAgent as error:
            return NoFit(f"worker {index} is pinned to an agent that cannot be told apart: {error}")
        if agent_id not in offered:
            missing.add(key)
        resolved.append(agent_id)
    if missing:
        return NoFit(
            f"waiting for the agents the job names: {', '.join(sorted(missing))} "
            f"{'is' if len(missing) == 1 else 'are'} offline or unknown (see `mwms agents`)"
        )
    free: dict[str, list[int]] = {a.agent_id: sorted(a.free_devices) for a in agents}
    ports: dict[str, set[int]] = {a.agent_id: set(a.used_ports) for a in agents}
    memory: dict[str, int | None] = {a.agent_id: a.memory_free for a in agents}
    placements: list[TaskPlacement] = []
    for index, agent_id in enumerate(resolved):
        agent = offered[agent_id]
        if agent.device_kind != kind:
            return NoFit(f"worker {index} needs {unit}s but agent {agent.name} offers {agent.device_kind}")
        if 0 < agent.memory_bytes < memory_per_worker:
            return NoFit(
                f"worker {index} needs {format_size(memory_per_worker)} but agent {agent.name} offers "
                f"{format_size(agent.memory_bytes)} in all: pin it elsewhere, or lower --memory-per-worker"
            )
        if len(free[agent.agent_id]) < count or not _has_free_port(agent, ports):
            return NoFit(
                f"waiting for capacity on agent {agent.name} (worker {index} needs {wcount(count, unit)}, "
                f"{len(free[agent.agent_id])} free); it starts when its running jobs finish"
            )
        left = memory[agent.agent_id]
        if not memory_fits(left, memory_per_worker):
            return NoFit(
                f"waiting for memory on agent {agent.name} (worker {index} needs "
                f"{format_size(memory_per_worker)}, {format_size(left or 0)} free); it starts when its "
                "running jobs finish"
            )
        if left is not None and memory_per_worker > 0:
            memory[agent.agent_id] = left - memory_per_worker
        taken = tuple(free[agent.agent_id][:count])
        free[agent.agent_id] = free[agent.agent_id][count:]
        port = _pick_port(agent, ports[agent.agent_id], rng)
        ports[agent.agent_id].add(port)
        placements.append(
            TaskPlacement(index, agent.agent_id, agent.address, port, kind, taken, max(0, memory_per_worker))
        )
    return placements
