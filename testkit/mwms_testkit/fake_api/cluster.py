"""The fake API's routes about the cluster rather than one job: health, bundle uploads, agents, the overview,
the queue and teams, each answering the coordinator's response model."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from fastapi import APIRouter, File, HTTPException, Query, Request, Response, UploadFile

from mwms.server.schemas import AgentOut, BundleOut, Overview, QueuePage, TeamOut
from mwms_testkit.fake_api.auth import State
from mwms_testkit.fake_api.fake_job import WAITING_STATES

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.post(
    "/api/v1/bundles", status_code=201, response_model=BundleOut, responses={200: {"model": BundleOut}}
)
async def upload_bundle(
    request: Request, response: Response, file: Annotated[UploadFile, File()], state: State
) -> Any:
    length = request.headers.get("content-length")
    state.upload_content_lengths.append(int(length) if length else None)
    data = await file.read()
    if file.filename != "bundle.tar.gz":
        raise HTTPException(400, f"unexpected file name {file.filename}")
    digest = hashlib.sha256(data).hexdigest()
    created = digest not in state.bundles
    state.bundles[digest] = data
    response.status_code = 201 if created else 200
    return {"digest": digest, "size": len(data), "format": "tar.gz", "created": created}


@router.get("/api/v1/agents", response_model=list[AgentOut])
def agents(state: State) -> Any:
    return state.listed_agents()


@router.delete("/api/v1/agents/{agent}", response_model=AgentOut)
def remove_agent(agent: str, state: State) -> Any:
    with state.lock:
        found = next((a for a in state.agents if agent in (a["id"], a["name"])), None)
        if found is None:
            raise HTTPException(404, f"agent {agent} not found")
        state.agents.remove(found)
        state.removed_agents.append(found["id"])
        return {**found, "online": False, "state": "removed"}


@router.get("/api/v1/overview", response_model=Overview)
def overview(state: State) -> Any:
    listed, states = state.listed_agents(), [job.state for job in state.jobs.values()]
    return {
        "agents_online": sum(agent["online"] for agent in listed),
        "agents_lost": sum(not agent["online"] for agent in listed),
        "devices_busy": sum(agent["devices_used"] for agent in listed),
        "devices_free": sum(agent["devices_free"] for agent in listed),
        "jobs_running": states.count("RUNNING"),
        "jobs_pending": states.count("PENDING"),
    }


@router.get("/api/v1/queue", response_model=QueuePage)
def queue(
    state: State,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Any:
    with state.lock:
        waiting = [] if state.empty else [job for job in state.jobs.values() if job.state in WAITING_STATES]
    waiting.sort(key=lambda job: (-job.priority, job.created_at))
    return {
        "jobs": [job.queue_row(offset + i + 1) for i, job in enumerate(waiting[offset : offset + limit])],
        "total": len(waiting),
        "offset": offset,
        "limit": limit,
    }


@router.get("/api/v1/teams", response_model=list[TeamOut])
def teams(state: State) -> Any:
    if state.teams_refusal:
        raise HTTPException(500, state.teams_refusal)
    return [] if state.empty else state.teams
