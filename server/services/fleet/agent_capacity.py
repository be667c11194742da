"""The scheduler's view of the agents (server/services/fleet/agents.py): what each online agent can offer
now, net of the tasks that hold its devices and ports and of the ports it recently refused."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, load_only

from mwms.server.db.models import Agent, Job, Task, utcnow
from mwms.server.poison import contain
from mwms.server.services.json_values import as_text, hashable, parsed
from mwms.server.services.scheduler.placement import AgentCapacity
from mwms.server.states import DEVICE_HOLDING_TASK_STATES, TaskState

log = logging.getLogger("mwms.server.agents")


def live_tasks_by_agent(session: Session) -> dict[str, list[Task]]:
    """Tasks that still hold devices and ports, grouped by agent id.

    LOST tasks count until their agent confirms they ended: an agent that was only cut off may still
    run them, and a new task on the same GPU would run out of memory.
    """
    holding = [s.value for s in TaskState if not s.terminal] + [TaskState.LOST.value]
    # Only what the agents list shows of a task: a gang's TF_CONFIG alone is kilobytes a task.
    shown = load_only(
        Task.job_id,
        Task.agent_id,
        Task.attempt_number,
        Task.index,
        Task.state,
        Task.device_kind,
        Task.device_indices,
    )
    rows = session.scalars(select(Task).where(Task.state.in_(holding)).options(shown)).all()
    grouped: dict[str, list[Task]] = {}
    for task in rows:
        grouped.setdefault(task.agent_id, []).append(task)
    return grouped


# A port an agent could not bind is avoided on that agent for this long (another program holds it).
REFUSED_PORT_MEMORY = timedelta(minutes=10)


def refused_ports_by_agent(session: Session, now: datetime) -> dict[str, set[int]]:
    """Ports that agents recently refused to start a task on, so placement does not pick them again."""
    rows = session.execute(
        select(Task.agent_id, Task.port).where(
            Task.state == TaskState.REJECTED.value, Task.ended_at > now - REFUSED_PORT_MEMORY
        )
    ).all()
    refused: dict[str, set[int]] = {}
    for agent_id, port in rows:
        refused.setdefault(agent_id, set()).add(port)
    return refused


# A task that holds devices, as a pass reads it once for the agents' capacities and the running jobs
# (server/services/scheduler/job_rows.py): job id, attempt id, agent id, device kind, device indices as
# stored, port, and its job's memory per worker.
HoldingRow = tuple[str, str, str, str, Any, int, int | None]


def holding_tasks(session: Session) -> list[HoldingRow]:
    """Every task holding devices (DEVICE_HOLDING_TASK_STATES), with what capacities and running jobs need."""
    rows = session.execute(
        select(
            Task.job_id,
            Task.attempt_id,
            Task.agent_id,
            Task.device_kind,
            as_text(Task.device_indices),
            Task.port,
            Job.memory_per_worker,
        )
        .join(Job, Job.id == Task.job_id)
        .where(Task.state.in_(DEVICE_HOLDING_TASK_STATES))
    )
    return [tuple(row) for row in rows]  # type: ignore[misc]


def capacities(
    session: Session,
    now: datetime | None = None,
    connected: frozenset[str] | None = None,
    memo: dict[str, tuple[Any, AgentCapacity]] | None = None,
    holding: list[HoldingRow] | None = None,
) -> list[AgentCapacity]:
    """What every online agent can offer now, net of the tasks it holds (their devices, and the memory their
    jobs asked per worker) and the ports it refused.

    `connected` (agent ids with a live session), when given, narrows the offer further: right after a
    coordinator start, agents count as online for a grace period before they have reconnected. Read as
    plain columns (no ORM objects): the scheduler asks on every pass, with up to thousands of agents.
    `memo`: the scheduler process's AgentCapacity of each agent with the exact values it was built from
    (its row, its tasks' raw devices and ports, its refused ports, its promised memory), so an agent whose
    values are the same as last pass is not parsed again; what was read is always the database's
    (replaced by this pass's agents). `holding`: the pass's holding_tasks, when it read them already.
    """
    now = now or utcnow()
    held: dict[str, list[tuple[str, int]]] = {}  # agent id -> (device indices as stored, port) per task
    promised: dict[str, int] = {}  # agent id -> the memory_per_worker of the tasks holding its devices
    for _, _, agent_id, _, indices, port, memory in holding_tasks(session) if holding is None else holding:
        held.setdefault(agent_id, []).append((hashable(indices), port))
        if memory:
            promised[agent_id] = promised.get(agent_id, 0) + int(memory)
    refused = refused_ports_by_agent(session, now)
    rows = session.execute(
        select(
            Agent.id,
            Agent.name,
            Agent.advertise_address,
            as_text(Agent.devices),
            Agent.port_low,
            Agent.port_high,
            Agent.memory_bytes,
        )
        .where(Agent.removed_at.is_(None), Agent.online_until > now)
        .order_by(Agent.name)
    ).all()
    result = []
    kept: dict[str, tuple[Any, AgentCapacity]] = {}
    nothing: frozenset[int] = frozenset()
    for row in rows:
        agent_id = row[0]
        if connected is not None and agent_id not in connected:
            continue
        tasks = tuple(held.get(agent_id, ()))
        ports = frozenset(refused[agent_id]) if agent_id in refused else nothing
        key = (tuple(row), tasks, ports, promised.get(agent_id, 0))
        # By agent id, compared by value: one lookup, and no hash of the agent's values.
        last = memo.get(agent_id) if memo is not None else None
        if last is not None and last[0] == key:
            capacity = last[1]
        else:
            try:
                capacity = _capacity(row, tasks, set(ports), promised.get(agent_id, 0))
            except Exception:  # noqa: BLE001 - one damaged agent row must not stall placement for everyone
                contain(log, "agent_capacity", agent_id, f"agent {agent_id}")
                continue
        kept[agent_id] = (key, capacity)
        result.append(capacity)
    if memo is not None:
        memo.clear()
        memo.update(kept)
    return result


def _capacity(
    row: Any, tasks: tuple[tuple[str, int], ...], refused: set[int], promised: int
) -> AgentCapacity:
    agent_id, name, address, devices_json, port_low, port_high, memory_bytes = row
    devices = parsed(devices_json)
    busy = {int(i) for indices, _ in tasks for i in parsed(indices)}
    device_ids: tuple[int, ...] = tuple(int(d["index"]) for d in devices)
    return AgentCapacity(
        agent_id=agent_id,
        name=name,
        address=address,
        device_kind=devices[0]["kind"] if devices else "cpu",
        all_devices=device_ids,
        free_devices=tuple(i for i in device_ids if i not in busy),
        port_low=port_low,
        port_high=port_high,
        used_ports=frozenset({port for _, port in tasks} | refused),
        memory_bytes=max(0, int(memory_bytes or 0)),
        memory_used=promised,
    )
