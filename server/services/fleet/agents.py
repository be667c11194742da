"""Agents: registration, removal, liveness as data (online_until); what each one can offer is in
server/services/fleet/agent_capacity.py (re-exported here)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from sqlalchemy import Table, bindparam, or_, select, update
from sqlalchemy.orm import Session, object_session

from mwms.agent_references import NAME_WITH_ID_FORM_HELP, name_has_id_form
from mwms.server.db.models import Agent, Task, utcnow
from mwms.server.errors import InvalidInput, NameTaken, NotFound, Unauthenticated
from mwms.server.observability.event_log import log_after_commit
from mwms.server.observability.instruments import count_registration
from mwms.server.services.fleet.agent_capacity import REFUSED_PORT_MEMORY as REFUSED_PORT_MEMORY
from mwms.server.services.fleet.agent_capacity import capacities as capacities
from mwms.server.services.fleet.agent_capacity import live_tasks_by_agent as live_tasks_by_agent
from mwms.server.services.fleet.agent_capacity import refused_ports_by_agent as refused_ports_by_agent
from mwms.server.services.fleet.agent_references import find_agent
from mwms.server.services.job_life.lifecycle import mark_task_lost
from mwms.server.states import TaskState

log = logging.getLogger("mwms.server.agents")


@dataclass(frozen=True)
class Registration:
    name: str
    hostname: str
    advertise_address: str
    port_low: int
    port_high: int
    devices: list[dict[str, Any]]
    version: str
    task_isolation: str = ""
    memory_bytes: int = 0  # what the agent offers its tasks in all; 0: unknown
    warm_pool_size: int = 0  # warm interpreters it keeps (worker_agent/warm_pool.py); 0: none


# Bounds of what an agent says about itself; the columns' sizes, and an address that fits TF_CONFIG.
MAX_AGENT_NAME = 200
MAX_HOSTNAME = 255
MAX_VERSION = 50
MAX_ISOLATION = 200
MAX_DEVICES = 1024
MAX_DEVICE_TEXT = 200
MAX_MEMORY_BYTES = 2**63 - 1  # the column's (BIGINT) largest
_ADDRESS = re.compile(r"[A-Za-z0-9.:\-\[\]%_]+")


def _printable(text: str) -> bool:
    return text.isprintable() and "\x00" not in text


def validate_registration(reg: Registration) -> None:
    """Raises InvalidInput with what to fix when a registration cannot be used."""
    if not reg.name.strip():
        raise InvalidInput("agent name is empty: pass --name")
    if len(reg.name) > MAX_AGENT_NAME or not _printable(reg.name):
        raise InvalidInput(f"agent name must be at most {MAX_AGENT_NAME} printable characters: pass --name")
    if name_has_id_form(reg.name):
        raise InvalidInput(f"agent name {reg.name!r} is refused: {NAME_WITH_ID_FORM_HELP}")
    if not reg.advertise_address.strip():
        raise InvalidInput("advertise address is empty: pass --advertise-address")
    if len(reg.advertise_address) > MAX_HOSTNAME or not _ADDRESS.fullmatch(reg.advertise_address):
        raise InvalidInput(
            f"advertise address {reg.advertise_address[:60]!r} is not a host name or IP address of at most "
            f"{MAX_HOSTNAME} ASCII characters: pass --advertise-address"
        )
    if len(reg.hostname) > MAX_HOSTNAME or not _printable(reg.hostname):
        raise InvalidInput(f"hostname must be at most {MAX_HOSTNAME} printable characters")
    if len(reg.version) > MAX_VERSION or not _printable(reg.version):
        raise InvalidInput(f"version must be at most {MAX_VERSION} printable characters")
    if len(reg.task_isolation) > MAX_ISOLATION or not _printable(reg.task_isolation):
        raise InvalidInput(f"task isolation must be at most {MAX_ISOLATION} printable characters")
    if len(reg.devices) > MAX_DEVICES:
        raise InvalidInput(f"an agent offers at most {MAX_DEVICES} devices; lower --slots")
    for device in reg.devices:
        if any(len(str(device.get(key, ""))) > MAX_DEVICE_TEXT for key in ("name", "uuid", "node")):
            raise InvalidInput(f"device names, uuids and nodes are at most {MAX_DEVICE_TEXT} characters")
        if not 0 <= int(device["index"]) < MAX_DEVICES:
            raise InvalidInput(f"device indices must lie in 0-{MAX_DEVICES - 1}")
    if len({int(d["index"]) for d in reg.devices}) != len(reg.devices):
        raise InvalidInput("device indices must be distinct")
    if not 0 <= reg.memory_bytes <= MAX_MEMORY_BYTES:
        raise InvalidInput(f"memory must lie in 0-{MAX_MEMORY_BYTES} bytes (0: unknown)")
    if not (1 <= reg.port_low <= reg.port_high <= 65535):
        raise InvalidInput(f"port range {reg.port_low}-{reg.port_high} is invalid: use LO-HI within 1-65535")
    if not reg.devices:
        raise InvalidInput("agent offers no devices: no GPU was found, so pass --slots N (N >= 1)")
    kinds = {d["kind"] for d in reg.devices}
    if len(kinds) != 1:
        raise InvalidInput("an agent offers either GPUs or CPU slots, not both")


def register_agent(
    session: Session,
    reg: Registration,
    timeout_s: float,
    now: datetime | None = None,
    connected: frozenset[str] = frozenset(),
) -> Agent:
    """Creates or updates the agent named `reg.name` and marks it online.

    A name held by a connected agent on another host is refused: two machines under one name would
    each report the other's tasks as lost.
    """
    validate_registration(reg)
    now = now or utcnow()
    agent = session.scalars(select(Agent).where(Agent.name == reg.name)).one_or_none()
    if agent is not None and agent.id in connected and agent.hostname != reg.hostname:
        raise NameTaken(
            f"agent name {reg.name!r} is in use by a connected agent on host {agent.hostname}; "
            "start this agent with another --name"
        )
    if agent is None:
        agent = Agent(name=reg.name)
        session.add(agent)
    agent.hostname = reg.hostname
    agent.advertise_address = reg.advertise_address
    agent.port_low = reg.port_low
    agent.port_high = reg.port_high
    agent.devices = reg.devices
    agent.version = reg.version
    agent.task_isolation = reg.task_isolation
    agent.memory_bytes = reg.memory_bytes
    agent.warm_pool_size = reg.warm_pool_size
    agent.registered_at = now
    touch_agent(agent, timeout_s, now)
    session.flush()
    count_registration(session)
    return agent


def touch_agent(agent: Agent, timeout_s: float, now: datetime | None = None) -> None:
    """Records that the agent was heard from: it stays online for `timeout_s` more."""
    now = now or utcnow()
    if agent.lost_at is not None:
        _log_back(object_session(agent), agent.id, agent.name, rejoined=agent.removed_at is not None)
    agent.last_heartbeat_at = now
    agent.online_until = now + timedelta(seconds=timeout_s)
    agent.lost_at = None
    agent.stopped_at = None


def mark_stopped(agent: Agent, now: datetime | None = None) -> None:
    """Records that the agent said goodbye (a clean stop): offline at once, for every check that reads
    online_until (placement, the API, the gauges), and never judged lost (newly_lost_agents).

    Heard from now: a liveness flush of what was heard before the goodbye is older and writes nothing
    (record_heartbeats never moves liveness backwards), so only a later stream brings it back. One judged
    lost meanwhile (its stream was stalled) was alive after all, and is stopped now, not lost."""
    now = now or utcnow()
    agent.stopped_at = now
    agent.last_heartbeat_at = now
    agent.online_until = now
    agent.lost_at = None


def _log_back(session: Session | None, agent_id: str, name: str, rejoined: bool = False) -> None:
    how = "joined again after an admin removed it" if rejoined else "is back"
    log_after_commit(
        session, f"agent {name} ({agent_id}) {how}", event="agent_back", agent=name, agent_id=agent_id
    )


def record_heartbeats(session: Session, seen: dict[str, datetime], timeout_s: float) -> None:
    """Writes what the in-memory liveness saw (server/live/liveness.py) in one statement: each agent stays
    online for `timeout_s` after it was last heard from, as `touch_agent` does; removed agents stay removed,
    and a newer time already written (a registration, a hello) is kept.
    """
    if not seen:
        return
    table = Agent.__table__
    assert isinstance(table, Table)
    statement = (
        update(table)
        .where(
            table.c.id == bindparam("agent_id"),
            table.c.removed_at.is_(None),
            # A registration or hello written meanwhile is newer: never move liveness backwards.
            or_(table.c.last_heartbeat_at.is_(None), table.c.last_heartbeat_at < bindparam("seen_at")),
        )
        .values(
            last_heartbeat_at=bindparam("seen_at"),
            online_until=bindparam("until"),
            lost_at=None,
            stopped_at=None,
        )
    )
    # Lost agents heard from again come back with this write: one read by primary key says which.
    lost = session.execute(
        select(Agent.id, Agent.name, Agent.last_heartbeat_at).where(
            Agent.id.in_(list(seen)), Agent.lost_at.is_not(None), Agent.removed_at.is_(None)
        )
    ).all()
    for agent_id, name, heard_at in lost:
        if heard_at is None or heard_at < seen[agent_id]:
            _log_back(session, agent_id, name)
    timeout = timedelta(seconds=timeout_s)
    # In id order, as every writer that updates several agents takes their rows, so two never deadlock.
    rows = [
        {"agent_id": agent_id, "seen_at": at, "until": at + timeout} for agent_id, at in sorted(seen.items())
    ]
    session.connection().execute(statement, rows)


def record_warm_pools(session: Session, pools: dict[str, tuple[int, int]]) -> None:
    """Writes the agents' warm pools as their heartbeats said (agent id -> (ready, resident bytes)), in id
    order like `record_heartbeats`, in one statement; removed agents are left alone."""
    if not pools:
        return
    table = Agent.__table__
    assert isinstance(table, Table)
    statement = (
        update(table)
        .where(table.c.id == bindparam("agent_id"), table.c.removed_at.is_(None))
        .values(warm_pool_ready=bindparam("ready"), warm_pool_bytes=bindparam("resident"))
    )
    rows = [
        {"agent_id": agent_id, "ready": ready, "resident": resident}
        for agent_id, (ready, resident) in sorted(pools.items())
    ]
    session.connection().execute(statement, rows)


def get_agent(session: Session, agent_id: str) -> Agent:
    """The agent behind a session; NotFound when unknown, Unauthenticated once an admin removed it."""
    agent = session.get(Agent, agent_id)
    if agent is None:
        raise NotFound(f"no agent with id {agent_id}; the agent must register again")
    if agent.removed_at is not None:
        raise Unauthenticated(f"agent {agent.name!r} was removed by an admin; its credential is void")
    return agent


def remove_agent(
    session: Session, reference: str, backoff_base_s: float, now: datetime | None = None
) -> Agent:
    """Revokes the credential of the agent `reference` names (its id or name, agent_references.find_agent)
    and ends its tasks as a lost agent's end; its name may join again. A removed agent is not found again.
    """
    now = now or utcnow()
    agent = find_agent(session, reference)
    agent.credential_hash = None
    agent.removed_at = now
    agent.online_until = None
    agent.lost_at = now  # handled: the reconciler must not treat it as newly lost
    open_tasks = session.scalars(
        select(Task).where(Task.agent_id == agent.id, Task.state.not_in(_TERMINAL_TASK_STATES))
    ).all()
    log_after_commit(
        session,
        f"agent {agent.name} ({agent.id}) removed by an admin: its credential is void; "
        f"{len(open_tasks)} task(s) on it lost",
        event="agent_removed",
        agent=agent.name,
        agent_id=agent.id,
        tasks_lost=len(open_tasks),
    )
    for task in open_tasks:
        mark_task_lost(session, agent, task, "lost (its agent was removed by an admin)", backoff_base_s, now)
    session.flush()
    return agent


def is_online(agent: Agent, now: datetime | None = None) -> bool:
    """Derived liveness: online while now < online_until."""
    now = now or utcnow()
    return agent.online_until is not None and now < agent.online_until


# An agent's state as the API, the CLI and mwms_agents{state} name it (cluster_counts counts the same rule).
AgentState = Literal["online", "stopped", "lost", "removed"]
AGENT_STATES: tuple[AgentState, ...] = get_args(AgentState)


def agent_state(agent: Agent, now: datetime | None = None) -> AgentState:
    """removed (by an admin), online (heard from within the agent timeout), stopped (said goodbye), or
    lost (silent past the timeout without a goodbye)."""
    if agent.removed_at is not None:
        return "removed"
    if is_online(agent, now):
        return "online"
    return "stopped" if agent.stopped_at is not None else "lost"


def device_kind(agent: Agent) -> str:
    return agent.devices[0]["kind"] if agent.devices else "cpu"


_TERMINAL_TASK_STATES = [s.value for s in TaskState if s.terminal]


def newly_lost_agents(session: Session, now: datetime | None = None) -> list[Agent]:
    """Agents whose online_until has passed and that have not been handled as lost yet; an agent that
    stopped cleanly (said goodbye, stopped_at) is never lost.

    Their rows are locked (PostgreSQL) until the caller's transaction ends: a replica's liveness flush
    does not wait for the writer lock (Database.write_unserialised), so one that commits while this pass
    judges either comes first (the row no longer matches and is skipped) or waits for the verdict; its
    beat, written after its agents in the same transaction, is then not seen either."""
    now = now or utcnow()
    rows = session.scalars(
        select(Agent)
        .where(
            Agent.online_until.is_not(None),
            Agent.online_until < now,
            Agent.lost_at.is_(None),
            Agent.stopped_at.is_(None),
        )
        .order_by(Agent.id)
        .with_for_update()
    ).all()
    return list(rows)


def grant_reconnect_grace(session: Session, timeout_s: float, now: datetime | None = None) -> None:
    """At coordinator start, gives every agent that was online a full timeout to reconnect.

    Without this, agents whose heartbeats stopped only because the coordinator was down would be
    declared lost, and their healthy attempts ended, before they had a chance to reconnect. Agents that
    stopped cleanly stay stopped: they were not online.
    """
    now = now or utcnow()
    rows = session.scalars(
        select(Agent).where(Agent.lost_at.is_(None), Agent.removed_at.is_(None), Agent.stopped_at.is_(None))
    ).all()
    for agent in rows:
        agent.online_until = max(agent.online_until or now, now + timedelta(seconds=timeout_s))
    session.flush()
