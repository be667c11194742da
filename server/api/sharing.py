"""Sharing a cluster (issue 18): the queue, teams and their quotas, and cordoning or draining agents.

Reads are open to every role; every write here is an admin's.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import TypeAdapter

from mwms.server.api.agents import AgentReference
from mwms.server.api.auth import AdminOnly
from mwms.server.api.deps import ReadSession, Views, WiringDep
from mwms.server.api.views import agent_out
from mwms.server.limits import INT64_MAX, MAX_NAME_CHARS
from mwms.server.schema_types import NAME_PATTERN, NAME_RULE, matching
from mwms.server.schemas import (
    AgentOut,
    CordonIn,
    DeviceAmounts,
    DeviceCounts,
    DrainIn,
    ErrorOut,
    QueueEntry,
    QueuePage,
    QuotaIn,
    TeamOut,
    ValidationErrorOut,
)
from mwms.server.services.fleet import cordons
from mwms.server.services.scheduler import queue_view, teams
from mwms.server.services.scheduler.queue_view import QueueRow
from mwms.server.services.views import TeamView, agents_view, teams_view

router = APIRouter(prefix="/api/v1", tags=["sharing"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "the caller is not an admin"},
    404: {"model": ErrorOut},
    409: {"model": ErrorOut},
    422: {"model": ValidationErrorOut},
}
MAX_QUEUE_PAGE = 500
# Printable and not blank (server/services/scheduler/teams.py), said in the schema so that clients know.
_PRINTABLE = {"pattern": NAME_PATTERN}
TeamName = Annotated[
    str,
    Path(
        min_length=1, max_length=MAX_NAME_CHARS, json_schema_extra=_PRINTABLE, description="the team's name"
    ),
    matching(NAME_PATTERN, NAME_RULE),
]
UserName = Annotated[
    str,
    Path(
        min_length=1, max_length=MAX_NAME_CHARS, json_schema_extra=_PRINTABLE, description="the user's name"
    ),
    matching(NAME_PATTERN, NAME_RULE),
]


def queue_entry(row: QueueRow) -> QueueEntry:
    return QueueEntry(
        position=row.position,
        job_id=row.job_id,
        name=row.name,
        state=row.state,
        team=row.team,
        submitted_by=row.submitted_by,
        priority=row.priority,
        workers=row.workers,
        gpus_per_worker=row.gpus_per_worker,
        memory_per_worker=row.memory_per_worker or None,
        preemptible=row.preemptible,
        created_at=row.created_at,
        waiting=dict(row.waiting),
        estimated_start=row.estimate.starts_at,
        estimate_basis=row.estimate.basis,
    )


def team_out(view: TeamView) -> TeamOut:
    quota, fair = view.quota, view.fair_share
    return TeamOut(
        team=view.team,
        members=list(view.members),
        quota=None if quota is None else DeviceCounts(gpus=quota.gpus, cpu_slots=quota.cpu_slots),
        in_use=DeviceCounts(gpus=view.in_use.get("gpu", 0), cpu_slots=view.in_use.get("cpu", 0)),
        usage_device_hours=amounts({kind: s / 3600 for kind, s in fair.usage.items()}),
        share=amounts(fair.share),
        standing=round(fair.standing, 3),
    )


def amounts(by_kind: dict[str, float]) -> DeviceAmounts:
    return DeviceAmounts(gpus=round(by_kind.get("gpu", 0.0), 3), cpu_slots=round(by_kind.get("cpu", 0.0), 3))


# -- the queue -------------------------------------------------------------------------------------------


QUEUE_PAGE = TypeAdapter(QueuePage)


@router.get("/queue", response_model=QueuePage)
def queue(
    wiring: WiringDep,
    views: Views,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_QUEUE_PAGE)] = 100,
) -> Response:
    """Every waiting job (PENDING, RESTARTING, PREEMPTING) in the order the scheduler places them, with
    the typed reason each waits and, where known, when it is estimated to start."""

    def build() -> QueuePage:
        with wiring.db.read() as session:
            rows = queue_view.queue(session)
            return QueuePage(
                jobs=[queue_entry(row) for row in rows[offset : offset + limit]],
                total=len(rows),
                offset=offset,
                limit=limit,
            )

    return views.json(("queue", offset, limit), QUEUE_PAGE, build)


# -- teams and quotas ------------------------------------------------------------------------------------


@router.get("/teams", response_model=list[TeamOut])
def list_teams(session: ReadSession) -> list[TeamOut]:
    """Every team with members, a quota, jobs holding devices or usage on record: members, quota, devices in
    use, and its fair share over time (decayed usage, share, standing)."""
    return [team_out(view) for view in teams_view(session)]


@router.put("/teams/{team}/members/{user}", response_model=TeamOut, responses=ERRORS)
def add_team_member(team: TeamName, user: UserName, admin: AdminOnly, wiring: WiringDep) -> TeamOut:
    """Puts a user in a team (out of any other): the jobs they submit from now on count against it."""
    with wiring.db.write() as session:
        member = teams.add_member(session, team, user, by=admin.user)
        [view] = teams_view(session, member.team)
        return team_out(view)


@router.delete("/teams/{team}/members/{user}", response_model=TeamOut, responses=ERRORS)
def remove_team_member(team: TeamName, user: UserName, _admin: AdminOnly, wiring: WiringDep) -> TeamOut:
    """Takes a user out of a team: their new jobs are a team of their own again."""
    with wiring.db.write() as session:
        teams.remove_member(session, team, user)
        [view] = teams_view(session, team)
        return team_out(view)


@router.put("/teams/{team}/quota", response_model=TeamOut, responses=ERRORS)
def set_team_quota(team: TeamName, quota: QuotaIn, admin: AdminOnly, wiring: WiringDep) -> TeamOut:
    """Sets (replaces) a team's quota of GPUs and CPU slots; null for a kind: no cap of that kind."""
    with wiring.db.write() as session:
        teams.set_quota(session, team, quota.gpus, quota.cpu_slots, by=admin.user)
        [view] = teams_view(session, team.strip())
        out = team_out(view)
    wiring.poke_scheduler()  # a raised quota may let waiting jobs in
    return out


@router.delete("/teams/{team}/quota", response_model=TeamOut, responses=ERRORS)
def clear_team_quota(team: TeamName, _admin: AdminOnly, wiring: WiringDep) -> TeamOut:
    """Removes a team's quota: its jobs are capped by nothing but the cluster."""
    with wiring.db.write() as session:
        teams.clear_quota(session, team)
        [view] = teams_view(session, team)
        out = team_out(view)
    wiring.poke_scheduler()
    return out


# -- cordons and drains ----------------------------------------------------------------------------------


@router.post("/agents/{agent}/cordon", response_model=AgentOut, responses=ERRORS)
def cordon_agent(agent: AgentReference, body: CordonIn, admin: AdminOnly, wiring: WiringDep) -> AgentOut:
    """Cordons an agent: nothing new is placed on it; what it runs keeps running."""
    with wiring.db.write() as session:
        cordoned = cordons.cordon(session, agent, by=admin.user, reason=body.reason)
        [view] = agents_view(session, cordoned.id)
        return agent_out(view)


@router.post("/agents/{agent}/uncordon", response_model=AgentOut, responses=ERRORS)
def uncordon_agent(agent: AgentReference, admin: AdminOnly, wiring: WiringDep) -> AgentOut:
    """Ends an agent's cordon or drain: jobs may be placed on it again."""
    with wiring.db.write() as session:
        uncordoned = cordons.uncordon(session, agent, by=admin.user)
        [view] = agents_view(session, uncordoned.id)
        out = agent_out(view)
    wiring.poke_scheduler()
    return out


@router.post("/agents/{agent}/drain", response_model=AgentOut, responses=ERRORS)
def drain_agent(agent: AgentReference, body: DrainIn, admin: AdminOnly, wiring: WiringDep) -> AgentOut:
    """Drains an agent: cordons it and preempts the jobs it runs (SIGTERM, the grace, then SIGKILL), which
    wait again in their place for other agents; with let_finish they run to their end instead."""
    settings = wiring.settings
    with wiring.db.write() as session:
        drained = cordons.drain(
            session,
            agent,
            by=admin.user,
            reason=body.reason,
            grace_s=body.grace_seconds,
            let_finish=body.let_finish,
            default_grace_s=settings.preemption_grace_s,
            max_grace_s=settings.max_preemption_grace_s,
        )
        [view] = agents_view(session, drained.id)
        out = agent_out(view)
    wiring.wake_agents(None)  # the preempted tasks' stops go out now
    wiring.poke_scheduler()
    return out
