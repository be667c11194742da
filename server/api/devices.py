"""/api/v1 device telemetry: the newest sample of every device, an agent's devices, a job's tasks' devices."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from mwms.server.api.agents import ERRORS as AGENT_ERRORS
from mwms.server.api.agents import AgentReference
from mwms.server.api.deps import ReadSession, WiringDep
from mwms.server.limits import INT64_MAX
from mwms.server.schemas import (
    AgentDevicesOut,
    AgentLatestDevicesOut,
    DevicePointOut,
    DeviceSampleOut,
    DeviceSeriesOut,
    ErrorOut,
    JobDevicesOut,
    TaskDevicesOut,
)
from mwms.server.services.fleet import device_identity
from mwms.server.services.job_life import jobs
from mwms.server.services.observing import device_series, device_telemetry
from mwms.server.services.observing.device_series import DeviceSeries
from mwms.server.services.observing.device_telemetry import LatestSample, LatestSamples

router = APIRouter(prefix="/api/v1", tags=["devices"])
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}}


def latest_samples(wiring: WiringDep) -> LatestSamples:
    return wiring.devices.latest


Latest = Annotated[LatestSamples, Depends(latest_samples)]


def _sample_out(s: LatestSample, uuids: dict[int, str]) -> DeviceSampleOut:
    return DeviceSampleOut(
        index=s.index,
        uuid=uuids.get(s.index, ""),
        utilization_pct=s.utilization_pct,
        memory_used_mib=s.memory_used_mib,
        memory_total_mib=s.memory_total_mib,
        temperature_c=s.temperature_c,
        at=s.at,
    )


def _series_out(series: list[DeviceSeries]) -> list[DeviceSeriesOut]:
    return [
        DeviceSeriesOut(
            index=s.index,
            uuid=s.uuid,
            points=[
                DevicePointOut(
                    at=p.at,
                    utilization_pct=p.utilization_pct,
                    memory_used_mib=p.memory_used_mib,
                    memory_total_mib=p.memory_total_mib,
                    temperature_c=p.temperature_c,
                )
                for p in s.points
            ],
        )
        for s in series
    ]


@router.get("/devices", response_model=list[AgentLatestDevicesOut])
def latest_devices(session: ReadSession, wiring: WiringDep, latest: Latest) -> list[AgentLatestDevicesOut]:
    """The newest sample of every device of every agent, whichever replica holds its stream: those this
    replica heard since it started, and those other replicas stored in the last minute."""
    readings = device_telemetry.newest_readings(session, latest, wiring.replica.id)
    uuids = device_identity.agents_gpu_uuids(session, readings.keys())
    return [
        AgentLatestDevicesOut(
            agent_id=agent_id, devices=[_sample_out(s, uuids.get(agent_id, {})) for s in devices]
        )
        for agent_id, devices in readings.items()
    ]


@router.get("/agents/{agent}/devices", response_model=AgentDevicesOut, responses=AGENT_ERRORS)
def agent_devices(
    agent: AgentReference,
    session: ReadSession,
    wiring: WiringDep,
    latest: Latest,
    minutes: Annotated[int, Query(ge=1, le=24 * 60, description="how far back the series go")] = 30,
) -> AgentDevicesOut:
    """An agent's devices: the newest sample of each (whichever replica holds its stream), and each one's
    series over the last `minutes`; `refused` counts what this replica refused of its streams."""
    found = device_series.agent_for_devices(session, agent)
    agent_id, uuids = found.id, device_identity.uuids_by_index(found.devices)
    width, series = device_series.agent_series(session, agent_id, minutes)
    newest = device_telemetry.newest_readings(session, latest, wiring.replica.id, agent_id=agent_id)
    return AgentDevicesOut(
        agent_id=agent_id,
        latest=[_sample_out(s, uuids) for s in newest.get(agent_id, [])],
        bucket_seconds=width,
        series=_series_out(series),
        refused=latest.refused(agent_id),
    )


@router.get("/jobs/{job_id}/devices", response_model=JobDevicesOut, responses=ERRORS)
def job_devices(
    job_id: str,
    session: ReadSession,
    attempt: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None,
) -> JobDevicesOut:
    """Each task's devices (utilisation, memory, temperature) over its run, for an attempt (the newest
    unless ?attempt= is given); CPU tasks have no series."""
    job = jobs.get_job(session, job_id)
    jobs.check_task_and_attempt(job, None, attempt)
    found = device_series.job_series(session, job, attempt)
    return JobDevicesOut(
        job_id=job.id,
        attempt=found.attempt,
        bucket_seconds=found.bucket_seconds,
        tasks=[
            TaskDevicesOut(
                task_index=t.task_index,
                agent_id=t.agent_id,
                agent_name=t.agent_name,
                device_kind=t.device_kind,
                device_indices=t.device_indices,
                device_uuids=t.device_uuids,
                started_at=t.started_at,
                ended_at=t.ended_at,
                series=_series_out(t.series),
            )
            for t in found.tasks
        ],
    )
