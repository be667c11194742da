"""Device telemetry read back: an agent's devices over a recent window, a job's tasks' devices over their run.

Series are downsampled in the database: samples fall into buckets of `bucket_seconds` (at least the
agents' sample interval apart when the window is short, wider so no series has more than MAX_POINTS
points), each bucket giving the mean utilisation and temperature and the highest memory use. One grouped
query per request, a range of ix_device_samples_agent_at for each agent it covers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, cast, func, literal_column, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, DeviceSample, Job, Task, utcnow
from mwms.server.services.fleet.agent_references import find_agent
from mwms.server.services.fleet.device_identity import task_uuids, uuids_by_index

MAX_POINTS = 240
MIN_BUCKET_SECONDS = 5


@dataclass(frozen=True)
class SeriesPoint:
    at: datetime
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float


@dataclass
class DeviceSeries:
    index: int
    points: list[SeriesPoint] = field(default_factory=list)
    uuid: str = ""  # as the agent registered it


@dataclass
class TaskDevices:
    """One task's devices over its run (no series for a CPU task, or before its agent sent any)."""

    task_index: int
    agent_id: str
    agent_name: str
    device_kind: str
    device_indices: list[int]
    device_uuids: list[str]  # in the order of device_indices ("" where unknown); [] for a CPU task
    started_at: datetime | None
    ended_at: datetime | None
    series: list[DeviceSeries]


@dataclass
class JobDevices:
    attempt: int | None
    bucket_seconds: int
    tasks: list[TaskDevices]


def bucket_seconds(start: datetime, end: datetime, max_points: int = MAX_POINTS) -> int:
    """The bucket width that keeps a series over [start, end] within `max_points` points."""
    span = max(0.0, (end - start).total_seconds())
    return max(MIN_BUCKET_SECONDS, math.ceil(span / max_points))


def _epoch_seconds(session: Session) -> ColumnElement[Any]:
    """DeviceSample.at as whole unix seconds, in the dialect at hand."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", DeviceSample.at)), BigInteger)
    return cast(func.strftime("%s", DeviceSample.at), BigInteger)


def _bucketed(
    session: Session, agent_ids: list[str], start: datetime, end: datetime, width: int
) -> dict[tuple[str, int], list[SeriesPoint]]:
    """Per (agent, device): the samples in [start, end] averaged per bucket of `width` seconds, in time order."""
    if not agent_ids:
        return {}
    # The width is written into the SQL, so the grouped expression and the selected one are the same text.
    bucket = (_epoch_seconds(session) // literal_column(str(int(width)), BigInteger)).label("bucket")
    rows = session.execute(
        select(
            DeviceSample.agent_id,
            DeviceSample.device_index,
            bucket,
            func.avg(DeviceSample.utilization_pct),
            func.max(DeviceSample.memory_used_mib),
            func.max(DeviceSample.memory_total_mib),
            func.avg(DeviceSample.temperature_c),
        )
        .where(DeviceSample.agent_id.in_(agent_ids), DeviceSample.at >= start, DeviceSample.at <= end)
        .group_by(DeviceSample.agent_id, DeviceSample.device_index, bucket)
        .order_by(DeviceSample.agent_id, DeviceSample.device_index, bucket)
    ).all()
    series: dict[tuple[str, int], list[SeriesPoint]] = defaultdict(list)
    for agent_id, index, number, utilization, used, total, temperature in rows:
        at = datetime.fromtimestamp(int(number) * width, tz=timezone.utc)
        series[(agent_id, index)].append(
            SeriesPoint(at, round(float(utilization), 2), int(used), int(total), round(float(temperature), 2))
        )
    return series


def agent_series(
    session: Session, agent_id: str, minutes: int, now: datetime | None = None
) -> tuple[int, list[DeviceSeries]]:
    """The agent's devices over the last `minutes` minutes: (bucket width, one series per device)."""
    end = now or utcnow()
    start = end - timedelta(minutes=minutes)
    width = bucket_seconds(start, end)
    found = _bucketed(session, [agent_id], start, end, width)
    agent = session.get(Agent, agent_id)  # loaded already when the caller found it by reference
    uuids = uuids_by_index(agent.devices if agent is not None else [])
    return width, [
        DeviceSeries(index, points, uuids.get(index, "")) for (_, index), points in sorted(found.items())
    ]


def job_series(session: Session, job: Job, attempt: int | None, now: datetime | None = None) -> JobDevices:
    """Each task's devices (its agent and its device_indices) within its started..ended window, for the
    given attempt or the newest; CPU tasks and tasks that never started have no series."""
    number = attempt if attempt is not None else max((a.number for a in job.attempts), default=None)
    if number is None:
        return JobDevices(None, MIN_BUCKET_SECONDS, [])
    rows = session.execute(
        select(Task, Agent.name, Agent.devices)
        .join(Attempt, Attempt.id == Task.attempt_id)
        .join(Agent, Agent.id == Task.agent_id)
        .where(Attempt.job_id == job.id, Attempt.number == number)
        .order_by(Task.index)
    ).all()
    end_of_all = now or utcnow()
    windows = {
        task.id: (task.started_at, task.ended_at or end_of_all)
        for task, _, _ in rows
        if task.device_kind == "gpu" and task.started_at is not None
    }
    if windows:
        start = min(w[0] for w in windows.values())
        end = max(w[1] for w in windows.values())
        width = bucket_seconds(start, end)
        agents = sorted({task.agent_id for task, _, _ in rows if task.id in windows})
        found = _bucketed(session, agents, start - timedelta(seconds=width), end, width)
    else:
        width, found = MIN_BUCKET_SECONDS, {}
    tasks = []
    for task, agent_name, devices in rows:
        uuids = task_uuids(task.device_kind, task.device_indices, uuids_by_index(devices or []))
        series = []
        if task.id in windows:
            task_start, task_end = windows[task.id]
            for index, uuid in zip(task.device_indices, uuids, strict=True):
                points = [
                    p
                    for p in found.get((task.agent_id, int(index)), [])
                    if task_start - timedelta(seconds=width) < p.at <= task_end
                ]
                series.append(DeviceSeries(int(index), points, uuid))
        tasks.append(
            TaskDevices(
                task_index=task.index,
                agent_id=task.agent_id,
                agent_name=agent_name,
                device_kind=task.device_kind,
                device_indices=[int(i) for i in task.device_indices],
                device_uuids=uuids,
                started_at=task.started_at,
                ended_at=task.ended_at,
                series=series,
            )
        )
    return JobDevices(number, width, tasks)


def agent_for_devices(session: Session, reference: str) -> Agent:
    """The agent whose devices are asked for, by its id or name (agent_references.find_agent)."""
    return find_agent(session, reference)
