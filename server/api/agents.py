"""/api/v1/agents and the cluster overview."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from sqlalchemy import func, select

from server.api.auth import AdminOnly
from server.api.deps import ReadSession, WiringDep
from server.api.views import agents_out
from server.db.models import Job
from server.schemas import AgentOut, ErrorOut, Overview
from server.services.agents import remove_agent
from server.states import JobState

router = APIRouter(prefix="/api/v1", tags=["agents"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "the value is one agent's id and another's name"},
    403: {"model": ErrorOut},
    404: {"model": ErrorOut},
}
# An agent's id, else its name (mwms/agent_references.py); a value that could mean two agents is refused.
AgentReference = Annotated[str, Path(max_length=200, description="the agent's id, else its name")]


@router.get("/agents", response_model=list[AgentOut])
def list_agents(session: ReadSession) -> list[AgentOut]:
    """Every agent that registered and was not removed, with its devices, usage and liveness."""
    return agents_out(session)


@router.delete("/agents/{agent}", response_model=AgentOut, responses=ERRORS)
def delete_agent(agent: AgentReference, _admin: AdminOnly, wiring: WiringDep) -> AgentOut:
    """Removes an agent: its credential is void at once, its session ends, and the tasks it ran end as a
    lost agent's do (their jobs restart under their policy). Its name may join again with a join token."""
    with wiring.db.write() as session:
        removed = remove_agent(session, agent, wiring.settings.restart_backoff_s)
        [out] = agents_out(session, removed.id)
    wiring.poke_scheduler()
    wiring.wake_agents(None)  # its stream sees the removal and ends; its jobs' other tasks get stops
    return out


@router.get("/overview", response_model=Overview)
def overview(session: ReadSession) -> Overview:
    """Agents online/lost, devices busy/free, jobs running/pending."""
    agents = agents_out(session)
    online = [a for a in agents if a.online]
    # Only the live states are counted: a range of ix_jobs_state_created_id, however many jobs finished.
    live = [s.value for s in (JobState.RUNNING, JobState.SCHEDULED, JobState.PENDING, JobState.RESTARTING)]
    counts = dict(
        session.execute(select(Job.state, func.count()).where(Job.state.in_(live)).group_by(Job.state)).all()
    )
    return Overview(
        agents_online=len(online),
        agents_lost=len(agents) - len(online),
        devices_busy=sum(a.devices_used for a in online),
        devices_free=sum(a.devices_free for a in online),
        jobs_running=sum(counts.get(s.value, 0) for s in (JobState.RUNNING, JobState.SCHEDULED)),
        jobs_pending=sum(counts.get(s.value, 0) for s in (JobState.PENDING, JobState.RESTARTING)),
    )
