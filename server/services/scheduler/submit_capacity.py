"""Whether the registered agents could ever hold a job: checked at submit, so a job that would wait forever
is refused with what the cluster has and what to change.

Every agent an admin has not removed counts with all its devices, whether it is online, stopped, lost or
cordoned (all of these can come back or be uncordoned, and a lost machine's job should not be refused while
it reboots). A cluster without any registered agent refuses nothing: agents may join after the submit
(a fresh cluster, a test that starts agents last). A job pinned to agents counts only the agents it names,
and of those only the ones registered (a pin to an agent that has not joined yet waits for it).

A job's memory_per_worker counts against the memory each agent offers its tasks (memory_bytes) as its
devices do; an agent that did not report its memory (0) is taken to hold any, so only a cluster whose
every candidate reported too little is refused. Agents do not report their CPUs, so cpus_per_worker (a cap,
not a reservation) is never refused here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.agent_references import AmbiguousAgent, UnknownAgent, resolve_agent_reference
from mwms.server.db.models import Agent
from mwms.server.services.scheduler.fit_rules import AgentShape, Misfit, Rule, devices_needed, never_fits
from mwms.server.services.wording import count
from mwms.sizes import format_size

# Agents named in a refusal: enough to see the shape of a small cluster, not a page of a large one.
NAMED_AGENTS = 5


@dataclass(frozen=True)
class RegisteredAgent:
    agent_id: str
    name: str
    kind: str  # "gpu" or "cpu"
    devices: int
    memory_bytes: int = 0  # offered to its tasks in all; 0: not reported

    @property
    def shape(self) -> AgentShape:
        return AgentShape(self.name, self.kind, self.devices, self.memory_bytes)


def registered_agents(session: Session) -> list[RegisteredAgent]:
    """Every agent not removed, with its device kind and count and its memory (columns only: one query)."""
    rows = session.execute(
        select(Agent.id, Agent.name, Agent.devices, Agent.memory_bytes)
        .where(Agent.removed_at.is_(None))
        .order_by(Agent.name)
    ).all()
    agents = []
    for agent_id, name, devices, memory in rows:
        listed = devices if isinstance(devices, list) else []
        kind = listed[0].get("kind", "cpu") if listed and isinstance(listed[0], dict) else "cpu"
        agents.append(RegisteredAgent(agent_id, name, kind, len(listed), max(0, int(memory or 0))))
    return agents


def _unit(kind: str) -> str:
    return "GPU" if kind == "gpu" else "CPU slot"


def _named(agents: Sequence[AgentShape]) -> str:
    shown = ", ".join(f"{a.name} {a.devices}" for a in agents[:NAMED_AGENTS])
    more = f" and {len(agents) - NAMED_AGENTS} more" if len(agents) > NAMED_AGENTS else ""
    return f"{shown}{more}"


def _named_memory(agents: Sequence[AgentShape]) -> str:
    shown = ", ".join(f"{a.name} {format_size(a.memory_bytes)}" for a in agents[:NAMED_AGENTS])
    more = f" and {len(agents) - NAMED_AGENTS} more" if len(agents) > NAMED_AGENTS else ""
    return f"{shown}{more}"


def impossible_reason(
    agents: Sequence[RegisteredAgent],
    workers: int,
    gpus_per_worker: int,
    pins: Sequence[str] | None,
    *,
    memory_per_worker: int = 0,
) -> str | None:
    """Why no set of `agents` can ever hold the job (services/scheduler/fit_rules.py), phrased as what to change;
    None when some can, or when no agent has registered yet."""
    if not agents:
        return None
    kind, per_worker = devices_needed(gpus_per_worker)
    if pins:
        return _pinned_reason(agents, kind, per_worker, pins, memory_per_worker)
    misfit = never_fits([a.shape for a in agents], workers, gpus_per_worker, memory_per_worker)
    return None if misfit is None else _refusal(misfit, len(agents), workers, memory_per_worker)


def _refusal(misfit: Misfit, registered: int, workers: int, memory: int) -> str:
    unit, per_worker, of_kind, largest = (
        _unit(misfit.kind),
        misfit.per_worker,
        misfit.candidates,
        misfit.largest,
    )
    if misfit.rule is Rule.NO_AGENT_OF_KIND:
        other = _unit("cpu" if misfit.kind == "gpu" else "gpu")
        fix = (
            "submit with --gpus-per-worker 0 to run on CPU slots, or start an agent on a GPU machine"
            if misfit.kind == "gpu"
            else "ask for --gpus-per-worker N to run on GPUs, or start an agent with --slots N"
        )
        return (
            f"none of the {count(registered, 'registered agent')} offers {unit}s (they offer {other}s): {fix}"
        )
    assert largest is not None
    if misfit.rule is Rule.DEVICES_PER_AGENT:
        return (
            f"each worker needs {count(per_worker, unit)} but the largest registered agent ({largest.name}) "
            f"has {largest.devices}: lower --gpus-per-worker to at most {largest.devices}, or add a machine "
            f"with {per_worker} {unit}s"
        )
    if misfit.rule is Rule.DEVICES_IN_ALL:
        start = (
            "start more agents (or give them more --slots)" if misfit.kind == "cpu" else "add GPU machines"
        )
        return (
            f"needs {count(workers, 'worker')} × {count(per_worker, unit)}, but the "
            f"{count(len(of_kind), 'registered agent')} with {unit}s ({_named(of_kind)}) can hold at "
            f"most {count(misfit.most, 'such worker')} even when idle: lower --workers to at most "
            f"{misfit.most}, or {start}"
        )
    wanted = format_size(memory)
    if misfit.rule is Rule.MEMORY_PER_AGENT:
        return (
            f"needs {wanted} per worker; the largest registered agent ({largest.name}) offers "
            f"{format_size(largest.memory_bytes)} to its tasks: lower --memory-per-worker to at most "
            f"{format_size(largest.memory_bytes)}, or add a machine with more memory"
        )
    return (
        f"needs {count(workers, 'worker')} × {count(per_worker, unit)} and {wanted}, but the memory of the "
        f"{count(len(of_kind), 'registered agent')} ({_named_memory(of_kind)}) holds at most "
        f"{count(misfit.most, 'such worker')} even when idle: lower --workers to at most {misfit.most} or "
        "--memory-per-worker, or add machines"
    )


def _pinned_reason(
    agents: Sequence[RegisteredAgent], kind: str, per_worker: int, pins: Sequence[str], memory: int = 0
) -> str | None:
    """For a pinned job: a named, registered agent that can never hold the workers pinned to it."""
    known = [(a.agent_id, a.name) for a in agents]
    by_id = {a.agent_id: a for a in agents}
    pinned: Counter[str] = Counter()
    for pin in pins:
        try:
            pinned[resolve_agent_reference(known, pin)] += 1
        except (UnknownAgent, AmbiguousAgent):
            continue  # not joined yet (it waits), or refused elsewhere (check_pins)
    unit = _unit(kind)
    for agent_id, workers in pinned.items():
        agent = by_id[agent_id]
        if agent.kind != kind:
            return (
                f"agent {agent.name}, which the job is pinned to, offers {_unit(agent.kind)}s, not {unit}s: "
                "pin the job to other agents, or change --gpus-per-worker"
            )
        if agent.devices < workers * per_worker:
            return (
                f"{count(workers, 'worker')} × {count(per_worker, unit)} are pinned to agent {agent.name}, "
                f"which has {count(agent.devices, unit)}: pin fewer workers to it, or lower --gpus-per-worker"
            )
        if memory and 0 < agent.memory_bytes < workers * memory:
            return (
                f"{count(workers, 'worker')} × {format_size(memory)} are pinned to agent {agent.name}, which "
                f"offers {format_size(agent.memory_bytes)} to its tasks: pin fewer workers to it, or lower "
                "--memory-per-worker"
            )
    return None
