"""Whether the registered agents could ever hold a job: checked at submit, so a job that would wait forever
is refused with what the cluster has and what to change.

Every agent an admin has not removed counts with all its devices, whether it is online, stopped, lost or
cordoned (all of these can come back or be uncordoned, and a lost machine's job should not be refused while
it reboots). A cluster without any registered agent refuses nothing: agents may join after the submit
(a fresh cluster, a test that starts agents last). A job pinned to agents counts only the agents it names,
and of those only the ones registered (a pin to an agent that has not joined yet waits for it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.agent_references import AmbiguousAgent, UnknownAgent, resolve_agent_reference
from mwms.server.db.models import Agent
from mwms.server.services.placement import devices_needed
from mwms.server.services.wording import count

# Agents named in a refusal: enough to see the shape of a small cluster, not a page of a large one.
NAMED_AGENTS = 5


@dataclass(frozen=True)
class RegisteredAgent:
    agent_id: str
    name: str
    kind: str  # "gpu" or "cpu"
    devices: int


def registered_agents(session: Session) -> list[RegisteredAgent]:
    """Every agent not removed, with its device kind and count (columns only: one query)."""
    rows = session.execute(
        select(Agent.id, Agent.name, Agent.devices).where(Agent.removed_at.is_(None)).order_by(Agent.name)
    ).all()
    agents = []
    for agent_id, name, devices in rows:
        listed = devices if isinstance(devices, list) else []
        kind = listed[0].get("kind", "cpu") if listed and isinstance(listed[0], dict) else "cpu"
        agents.append(RegisteredAgent(agent_id, name, kind, len(listed)))
    return agents


def _unit(kind: str) -> str:
    return "GPU" if kind == "gpu" else "CPU slot"


def _named(agents: Sequence[RegisteredAgent]) -> str:
    shown = ", ".join(f"{a.name} {a.devices}" for a in agents[:NAMED_AGENTS])
    more = f" and {len(agents) - NAMED_AGENTS} more" if len(agents) > NAMED_AGENTS else ""
    return f"{shown}{more}"


def impossible_reason(
    agents: Sequence[RegisteredAgent], workers: int, gpus_per_worker: int, pins: Sequence[str] | None
) -> str | None:
    """Why no set of `agents` can ever hold the job, phrased as what to change; None when some can."""
    if not agents:
        return None
    kind, per_worker = devices_needed(gpus_per_worker)
    unit = _unit(kind)
    if pins:
        return _pinned_reason(agents, kind, per_worker, pins)
    of_kind = [a for a in agents if a.kind == kind]
    if not of_kind:
        other = _unit("cpu" if kind == "gpu" else "gpu")
        fix = (
            "submit with --gpus-per-worker 0 to run on CPU slots, or start an agent on a GPU machine"
            if kind == "gpu"
            else "ask for --gpus-per-worker N to run on GPUs, or start an agent with --slots N"
        )
        return f"none of the {count(len(agents), 'registered agent')} offers {unit}s (they offer {other}s): {fix}"
    largest = max(of_kind, key=lambda a: a.devices)
    if largest.devices < per_worker:
        return (
            f"each worker needs {count(per_worker, unit)} but the largest registered agent ({largest.name}) "
            f"has {largest.devices}: lower --gpus-per-worker to at most {largest.devices}, or add a machine "
            f"with {per_worker} {unit}s"
        )
    most = sum(a.devices // per_worker for a in of_kind)
    if most < workers:
        start = "start more agents (or give them more --slots)" if kind == "cpu" else "add GPU machines"
        return (
            f"needs {count(workers, 'worker')} × {count(per_worker, unit)}, but the "
            f"{count(len(of_kind), 'registered agent')} with {unit}s ({_named(of_kind)}) can hold at "
            f"most {count(most, 'such worker')} even when idle: lower --workers to at most {most}, or {start}"
        )
    return None


def _pinned_reason(
    agents: Sequence[RegisteredAgent], kind: str, per_worker: int, pins: Sequence[str]
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
    return None
