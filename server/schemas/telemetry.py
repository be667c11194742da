"""What jobs and agents report as they run: log lines, metric points, and device telemetry (issue 11)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from mwms.metrics_line import NonFinite
from mwms.server.schemas.common import DEVICE_UUID_DESCRIPTION, DEVICE_UUIDS_DESCRIPTION


class LogLineOut(BaseModel):
    id: int
    task: int
    attempt: int
    seq: int
    stream: str
    text: str
    at: datetime
    redraw: bool = Field(
        default=False,
        description="a newer state of the line before it of this task and stream (a `\\r` redraw, such as "
        "a progress bar): it replaces that line",
    )


class LogPage(BaseModel):
    lines: list[LogLineOut]
    next_after: int = Field(description="pass as ?after= to get only newer lines")


class MetricPointOut(BaseModel):
    name: str
    step: int
    value: float | NonFinite = Field(description='a number, or "NaN", "Infinity" or "-Infinity"')
    wall_time: datetime
    attempt: int


class MetricSeries(BaseModel):
    points: list[MetricPointOut]
    cursor: int = Field(
        description="pass as `after` to read only the points stored after these (0: none stored yet)"
    )
    more: bool = Field(
        description="true: more points match than this page holds; read on with after=cursor (pages read "
        "after a cursor are in storage order)"
    )


class DeviceSampleOut(BaseModel):
    """One device's newest sample (GPU, through NVML on its agent), as the coordinator received it."""

    index: int
    uuid: str = Field(default="", description=DEVICE_UUID_DESCRIPTION)
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float
    at: datetime


class DevicePointOut(BaseModel):
    """One bucket of a device's series: mean utilisation and temperature, highest memory use."""

    at: datetime
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float


class DeviceSeriesOut(BaseModel):
    index: int
    uuid: str = Field(default="", description=DEVICE_UUID_DESCRIPTION)
    points: list[DevicePointOut]


class AgentDevicesOut(BaseModel):
    agent_id: str
    latest: list[DeviceSampleOut] = Field(description="the newest sample of each device")
    bucket_seconds: int = Field(description="the width of one point of the series")
    series: list[DeviceSeriesOut]
    refused: int = Field(description="samples from this agent refused since the coordinator started")


class AgentLatestDevicesOut(BaseModel):
    agent_id: str
    devices: list[DeviceSampleOut]


class TaskDevicesOut(BaseModel):
    task_index: int
    agent_id: str
    agent_name: str
    device_kind: str
    device_indices: list[int] = Field(description="the host's indices of the devices it holds")
    device_uuids: list[str] = Field(default_factory=list, description=DEVICE_UUIDS_DESCRIPTION)
    started_at: datetime | None
    ended_at: datetime | None
    series: list[DeviceSeriesOut] = Field(description="empty for CPU tasks and tasks that never started")


class JobDevicesOut(BaseModel):
    job_id: str
    attempt: int | None
    bucket_seconds: int
    tasks: list[TaskDevicesOut]
