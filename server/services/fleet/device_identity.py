"""A GPU by its identity: the UUID behind a host index, from what its agent registered.

Tasks store the host indices of their GPUs (Task.device_indices); an index says where a GPU sits on its
machine, not which one it is (a reboot or a changed CUDA_VISIBLE_DEVICES can renumber them). The agent
registers each GPU with its UUID (Agent.devices: dicts with kind, index, uuid, node), so the API shows
both, read from the agent's row: no column of its own, and an agent that sent none (an old one, CPU
slots) gives "". A task's agent re-registering with other GPUs names the GPUs it has now.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent

# By agent id: the UUID of each GPU the agent registered, by host index.
GpuUuids = dict[str, dict[int, str]]


def uuids_by_index(devices: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """The UUID of each GPU among an agent's registered `devices`, by index (those without one left out)."""
    found: dict[int, str] = {}
    for device in devices:
        index, uuid = device.get("index"), device.get("uuid")
        if device.get("kind") == "gpu" and isinstance(index, int) and isinstance(uuid, str) and uuid:
            found[index] = uuid
    return found


def task_uuids(device_kind: str, device_indices: Iterable[Any], uuids: Mapping[int, str]) -> list[str]:
    """A task's GPUs' UUIDs in the order of its `device_indices` ("" where unknown); [] for a CPU task."""
    if device_kind != "gpu":
        return []
    return [uuids.get(int(index), "") for index in device_indices]


def agents_gpu_uuids(session: Session, agent_ids: Collection[str]) -> GpuUuids:
    """The GPU UUIDs of the given agents, by agent id then index, in one query."""
    if not agent_ids:
        return {}
    rows = session.execute(select(Agent.id, Agent.devices).where(Agent.id.in_(set(agent_ids)))).all()
    return {agent_id: uuids_by_index(devices or []) for agent_id, devices in rows}
