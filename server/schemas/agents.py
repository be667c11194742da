"""Agents, their devices and tasks, and the cluster overview."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from mwms.server.schemas.common import DEVICE_UUIDS_DESCRIPTION


class DeviceOut(BaseModel):
    kind: str
    index: int
    name: str
    uuid: str = ""
    node: str = Field(
        default="",
        description='its device file on the agent\'s machine, e.g. "/dev/nvidia3"; empty for CPU slots and '
        "from agents that do not report it",
    )
    memory_mib: int = 0


class AgentTaskOut(BaseModel):
    job_id: str
    job_name: str
    task_index: int
    attempt: int
    state: str
    device_indices: list[int] = Field(description="the host's indices of the devices it holds")
    device_uuids: list[str] = Field(default_factory=list, description=DEVICE_UUIDS_DESCRIPTION)


class WarmPoolOut(BaseModel):
    """An agent's warm interpreters: sandboxed Pythons that imported TensorFlow already, one task each."""

    size: int = Field(description="how many the agent keeps")
    ready: int = Field(description="how many are ready for a task now, as its last heartbeat said")
    memory_bytes: int = Field(description="the resident memory of those waiting, as its last heartbeat said")


class AgentOut(BaseModel):
    id: str
    name: str
    hostname: str
    address: str
    port_range: str
    version: str
    task_isolation: str = Field(
        "", description="How the agent confines its tasks, e.g. 'bwrap sandbox; a uid per job'"
    )
    online: bool
    state: Literal["online", "stopped", "lost", "removed"] = Field(
        "online",
        description="online (heard from within the agent timeout); stopped (it said goodbye: a clean stop "
        "such as `systemctl stop`); lost (silent past the agent timeout without a goodbye); removed by an admin",
    )
    stopped_at: datetime | None = Field(None, description="when it said goodbye; null unless stopped")
    lost_at: datetime | None = Field(None, description="when the coordinator handled it as lost; null if not")
    last_heartbeat_at: datetime | None
    devices: list[DeviceOut]
    memory_bytes: int | None = Field(
        default=None,
        description="memory the agent offers its tasks in all (placement counts jobs' memory_per_worker "
        "against it); null: not reported",
    )
    devices_used: int
    devices_free: int
    warm_pool: WarmPoolOut | None = Field(
        default=None, description="its warm interpreters (`mwms agent --warm-pool N`); null: it keeps none"
    )
    tasks: list[AgentTaskOut]
    cordoned: bool = Field(default=False, description="no new jobs are placed on it (`mwms agent cordon`)")
    cordoned_at: datetime | None = None
    cordoned_by: str = Field(default="", description="the admin who cordoned or drained it")
    cordon_reason: str = ""
    draining: bool = Field(
        default=False, description="drained: its jobs were preempted (or are let finish) to run elsewhere"
    )
    drained: bool = Field(default=False, description="draining, and no task holds its devices any more")


class Overview(BaseModel):
    agents_online: int
    agents_lost: int
    agents_stopped: int = Field(0, description="agents that said goodbye (a clean stop): not counted as lost")
    devices_busy: int
    devices_free: int
    jobs_running: int
    jobs_pending: int
