"""/api/v1/agents and the cluster overview."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import TypeAdapter

from mwms.server.api.auth import AdminOnly
from mwms.server.api.deps import Views, WiringDep
from mwms.server.api.views import agent_out
from mwms.server.schemas import AgentOut, ErrorOut, Overview
from mwms.server.services.fleet.agents import remove_agent
from mwms.server.services.observing.cluster_counts import count_overview
from mwms.server.services.views import agents_view

router = APIRouter(prefix="/api/v1", tags=["agents"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "the value is one agent's id and another's name"},
    403: {"model": ErrorOut},
    404: {"model": ErrorOut},
}
# An agent's id, else its name (mwms/agent_references.py); a value that could mean two agents is refused.
AgentReference = Annotated[str, Path(max_length=200, description="the agent's id, else its name")]


AGENT_LIST = TypeAdapter(list[AgentOut])


@router.get("/agents", response_model=list[AgentOut])
def list_agents(wiring: WiringDep, views: Views) -> Response:
    """Every agent that registered and was not removed, with its devices, usage and liveness."""

    def build() -> list[AgentOut]:
        with wiring.db.read() as session:
            return [agent_out(view) for view in agents_view(session)]

    return views.json("agents", AGENT_LIST, build)


@router.delete("/agents/{agent}", response_model=AgentOut, responses=ERRORS)
def delete_agent(agent: AgentReference, _admin: AdminOnly, wiring: WiringDep) -> AgentOut:
    """Removes an agent: its credential is void at once, its session ends, and the tasks it ran end as a
    lost agent's do (their jobs restart under their policy). Its name may join again with a join token."""
    with wiring.db.write() as session:
        removed = remove_agent(session, agent, wiring.settings.restart_backoff_s)
        [view] = agents_view(session, removed.id)
        out = agent_out(view)
    wiring.poke_scheduler()
    wiring.wake_agents(None)  # its stream sees the removal and ends; its jobs' other tasks get stops
    return out


OVERVIEW = TypeAdapter(Overview)


@router.get("/overview", response_model=Overview)
def overview(wiring: WiringDep, views: Views) -> Response:
    """Agents online/lost/stopped, devices busy/free, jobs running/pending."""

    def build() -> Overview:
        with wiring.db.read() as session:
            counts = count_overview(session)
        return Overview(
            agents_online=counts.agents_online,
            agents_lost=counts.agents_lost,
            agents_stopped=counts.agents_stopped,
            devices_busy=counts.devices_busy,
            devices_free=counts.devices_free,
            jobs_running=counts.jobs_running,
            jobs_pending=counts.jobs_pending,
        )

    return views.json("overview", OVERVIEW, build)
