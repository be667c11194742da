"""/api/v1/agents and the cluster overview."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import func, select

from server.api.deps import ReadSession
from server.api.views import agents_out
from server.db.models import Job
from server.schemas import AgentOut, Overview
from server.states import JobState

router = APIRouter(prefix="/api/v1", tags=["agents"])


@router.get("/agents", response_model=list[AgentOut])
def list_agents(session: ReadSession) -> list[AgentOut]:
    """Every agent that ever registered, with its devices, usage and liveness."""
    return agents_out(session)


@router.get("/overview", response_model=Overview)
def overview(session: ReadSession) -> Overview:
    """Agents online/lost, devices busy/free, jobs running/pending."""
    agents = agents_out(session)
    online = [a for a in agents if a.online]
    counts = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).tuples().all())
    return Overview(
        agents_online=len(online),
        agents_lost=len(agents) - len(online),
        devices_busy=sum(a.devices_used for a in online),
        devices_free=sum(a.devices_free for a in online),
        jobs_running=sum(counts.get(s.value, 0) for s in (JobState.RUNNING, JobState.SCHEDULED)),
        jobs_pending=sum(counts.get(s.value, 0) for s in (JobState.PENDING, JobState.RESTARTING)),
    )
