"""The queries behind the API's multi-row answers: an agent with its live tasks, a job with its agents'
names and progress, a stack dump with its agents' names and parsed threads. Each view is read in a fixed number of queries, whatever it holds; the transports
shape the results (server/api/views.py), they do not query.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, StackDump, StackRequest, Task, utcnow
from mwms.server.schemas import ATTEMPTS_SHOWN
from mwms.server.services.fleet.agents import AgentState, agent_state, capacities, live_tasks_by_agent
from mwms.server.services.fleet.device_identity import GpuUuids, task_uuids, uuids_by_index
from mwms.server.services.job_life.jobs import newest_attempts, read_job
from mwms.server.services.observing import stacks
from mwms.server.services.observing.stack_text import DumpReading, ThreadStack, read_dump
from mwms.server.services.observing.telemetry import Progress, latest_progress
from mwms.server.services.scheduler import fair_share, teams
from mwms.server.services.scheduler.fair_share import TeamStanding
from mwms.server.services.scheduler.scheduling import WAITING_STATES
from mwms.server.services.scheduler.teams import Quota


@dataclass(frozen=True)
class AgentView:
    """An agent, its liveness and the tasks that hold its devices (with their jobs' names)."""

    agent: Agent
    online: bool
    tasks: list[Task]
    state: AgentState  # online, stopped (said goodbye), lost or removed
    job_names: dict[str, str]  # job id -> name, for the jobs of `tasks`

    @property
    def devices_used(self) -> int:
        return len({i for t in self.tasks for i in t.device_indices})

    @property
    def devices_free(self) -> int:
        return max(0, len(self.agent.devices) - self.devices_used)

    @property
    def drained(self) -> bool:
        """Draining, and no task holds its devices any more: the machine may be taken away."""
        return self.agent.draining and not self.tasks

    def device_uuids(self, task: Task) -> list[str]:
        """The UUIDs of `task`'s GPUs on this agent, in the order of its device_indices."""
        return task_uuids(task.device_kind, task.device_indices, uuids_by_index(self.agent.devices))


@dataclass(frozen=True)
class JobView:
    """A job to show in full, with the names of the agents its tasks ran on and its latest progress."""

    job: Job
    attempts: list[Attempt]  # its newest ATTEMPTS_SHOWN, oldest first, with their tasks and events
    attempt_count: int  # all it has had
    agent_names: dict[str, str]
    progress: Progress
    gpu_uuids: GpuUuids = field(default_factory=dict)  # of its tasks' agents, by agent id then index
    latest_stacks: str | None = None  # the id of its newest stack dump; None: none taken yet

    def device_uuids(self, task: Task) -> list[str]:
        """The UUIDs of `task`'s GPUs, in the order of its device_indices, from its agent's registration."""
        return task_uuids(task.device_kind, task.device_indices, self.gpu_uuids.get(task.agent_id, {}))


@dataclass(frozen=True)
class TaskStacksView:
    """One task's answer to a stack request: the stored dump, its agent's name and what its snapshots say."""

    dump: StackDump
    agent_name: str
    answered: bool
    reading: DumpReading

    @property
    def threads(self) -> list[ThreadStack]:
        """The threads of the snapshot shown (`reading`)."""
        return self.reading.threads


@dataclass(frozen=True)
class StackDumpsView:
    """A stack request with every task's answer; complete when every task answered."""

    request: StackRequest
    tasks: list[TaskStacksView]

    @property
    def complete(self) -> bool:
        return all(t.answered for t in self.tasks)


def agent_names_and_gpu_uuids(session: Session, agent_ids: set[str]) -> tuple[dict[str, str], GpuUuids]:
    """Names and GPU UUIDs (by index) of the given agents, in one query."""
    if not agent_ids:
        return {}, {}
    rows = session.execute(select(Agent.id, Agent.name, Agent.devices).where(Agent.id.in_(agent_ids))).all()
    return {i: name for i, name, _ in rows}, {i: uuids_by_index(devices or []) for i, _, devices in rows}


@dataclass(frozen=True)
class TeamView:
    """A team: its members, its quota (None: none), the devices its jobs hold, by kind ("gpu", "cpu"), and its
    fair share over time (server/services/scheduler/fair_share.py): decayed usage, share and standing."""

    team: str
    members: list[str]
    quota: Quota | None
    in_use: dict[str, int]
    fair_share: TeamStanding


def teams_view(session: Session, team: str | None = None, now: datetime | None = None) -> list[TeamView]:
    """Every team that has members, a quota, jobs holding devices or usage on record, by name; or only `team`
    (seven queries). Its share is counted as queue order counts it, among the teams that run or wait, on
    the online agents' devices."""
    now = now or utcnow()
    members, quotas, used = teams.members(session), teams.quotas(session), teams.usage(session)
    usage = fair_share.read_usage(session, now)
    # Jobs from before teams existed have team "": no team to show.
    names = sorted(n for n in {*members, *quotas, *used, *usage} if n) if team is None else [team]
    waiting = session.scalars(select(Job.team).where(Job.state.in_(WAITING_STATES)).distinct()).all()
    totals = {"gpu": 0, "cpu": 0}
    for agent in capacities(session, now):
        totals[agent.device_kind] = totals.get(agent.device_kind, 0) + len(agent.all_devices)
    caps = {q.team: {"gpu": q.gpus, "cpu": q.cpu_slots} for q in quotas.values()}
    standings = fair_share.standings(usage, names, [*used, *waiting], totals, caps)
    return [
        TeamView(
            team=name,
            members=members.get(name, []),
            quota=quotas.get(name),
            in_use={"gpu": 0, "cpu": 0} | used.get(name, {}),
            fair_share=standings[name],
        )
        for name in names
    ]


def agents_view(session: Session, agent_id: str | None = None) -> list[AgentView]:
    """Agents an admin has not removed, or only the agent `agent_id` (removed or not); three queries."""
    query = select(Agent).order_by(Agent.name)
    query = query.where(Agent.id == agent_id) if agent_id else query.where(Agent.removed_at.is_(None))
    held = live_tasks_by_agent(session)
    jobs: dict[str, str] = dict(
        session.execute(  # names only: loading whole jobs (options, waiting) cost most of this view
            select(Job.id, Job.name).where(Job.id.in_({t.job_id for tasks in held.values() for t in tasks}))
        ).all()
    )
    views = []
    for agent in session.scalars(query).all():
        tasks = held.get(agent.id, [])
        names = {t.job_id: jobs.get(t.job_id, "") for t in tasks}
        state = agent_state(agent)
        views.append(
            AgentView(agent=agent, online=state == "online", tasks=tasks, job_names=names, state=state)
        )
    return views


def job_view(session: Session, job: Job) -> JobView:
    """`job` with its newest attempts, their agents' names and its progress; load it with jobs.read_job so
    its events come in one query."""
    attempts, count = newest_attempts(session, job.id, ATTEMPTS_SHOWN)
    names, uuids = agent_names_and_gpu_uuids(session, {t.agent_id for a in attempts for t in a.tasks})
    return JobView(
        job=job,
        attempts=attempts,
        attempt_count=count,
        agent_names=names,
        progress=latest_progress(session, job),
        gpu_uuids=uuids,
        latest_stacks=stacks.latest_request_id(session, job.id),
    )


def read_job_view(session: Session, job_id: str) -> JobView:
    """The job `job_id` in full (NotFound when there is none)."""
    return job_view(session, read_job(session, job_id))


def read_stacks_view(session: Session, job_id: str, request_id: str | None) -> StackDumpsView:
    """The job's stack dump `request_id` (its newest when None) with its agents' names (one query) and
    each dump's threads; NotFound when there is none."""
    request = stacks.read_stack_request(session, job_id, request_id)
    names = stacks.agent_names(session, request)
    tasks = [
        TaskStacksView(
            dump=dump,
            agent_name=names.get(dump.agent_id, ""),
            answered=stacks.answered(dump),
            reading=read_dump(dump.text),
        )
        for dump in request.dumps
    ]
    return StackDumpsView(request=request, tasks=tasks)
