"""What the cluster holds right now, counted in a fixed number of aggregate queries (Prometheus gauges),
and the dashboard's overview of it.

Four GROUP BY queries whatever the size: jobs by state (one pass over the state index: about 4 ms per
100,000 jobs in SQLite), live tasks by state (an index seek), agents by liveness and device kind, and
the devices that live tasks hold. Agents' liveness is
the same derived rule the API uses (online while now < online_until; the in-memory liveness is flushed
into online_until every reconciler pass, about once a second), so Grafana and the dashboard agree.

Sharing the cluster (`count_sharing`) takes three more, whatever the size: waiting jobs by team and
priority band (a range of the state index), the devices each team's tasks hold (an index seek on the
tasks that hold devices, as services.scheduler.teams.usage counts them), and the quotas (an admin-managed table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Integer, case, func, select
from sqlalchemy.orm import Session

from mwms.priorities import HIGH_PRIORITY_FROM, NORMAL_PRIORITY_FROM
from mwms.server.db.models import Agent, Job, Task, TeamQuota, utcnow
from mwms.server.states import DEVICE_HOLDING_TASK_STATES, JobState, TaskState

# Tasks not ended: what the cluster runs now. Ended tasks are history (every attempt of every job) and
# would make each scrape read the whole table; jobs by state and the histograms cover what ended.
LIVE_TASK_STATES = [s.value for s in TaskState if not s.terminal]


# The overview's job counts: only the live states are counted, a range of ix_jobs_state_created_id
# however many jobs finished.
_JOBS_RUNNING = [JobState.RUNNING.value, JobState.SCHEDULED.value]
_JOBS_PENDING = [JobState.PENDING.value, JobState.RESTARTING.value, JobState.PREEMPTING.value]

# The queue: jobs that wait to be placed (again), a preempted one whose workers are saving included.
QUEUED_JOB_STATES = [JobState.PENDING.value, JobState.RESTARTING.value, JobState.PREEMPTING.value]
# Quotas read per scrape at most; far above any real number of teams (services.scheduler.teams lists as many).
MAX_QUOTAS_COUNTED = 10_000


@dataclass(frozen=True)
class ClusterOverview:
    """Agents online/lost/stopped, devices of online agents busy/free, jobs running (or placed)/pending."""

    agents_online: int
    agents_lost: int
    devices_busy: int
    devices_free: int
    jobs_running: int
    jobs_pending: int
    agents_stopped: int = 0  # said goodbye (a clean stop): neither online nor lost


@dataclass
class ClusterCounts:
    jobs_by_state: dict[str, int] = field(default_factory=dict)
    tasks_by_state: dict[str, int] = field(default_factory=dict)  # live ones: ASSIGNED, STARTING, RUNNING
    agents_by_liveness: dict[str, int] = field(default_factory=dict)  # services.fleet.agents.AGENT_STATES
    # Devices of online agents, and those of them that live tasks hold, by kind ("gpu", "cpu").
    devices_by_kind: dict[str, int] = field(default_factory=dict)
    devices_used_by_kind: dict[str, int] = field(default_factory=dict)


@dataclass
class SharingCounts:
    """The queue and the teams' use of the cluster, by team (the job's team when it was submitted)."""

    # team -> band -> jobs waiting (QUEUED_JOB_STATES)
    queued: dict[str, dict[str, int]] = field(default_factory=dict)
    # team -> kind ("gpu", "cpu") -> GPUs / CPU slots its tasks hold now
    in_use: dict[str, dict[str, int]] = field(default_factory=dict)
    # team -> kind -> the quota's cap; a kind without a cap is absent
    quotas: dict[str, dict[str, int]] = field(default_factory=dict)


def count_cluster(session: Session, now: datetime | None = None) -> ClusterCounts:
    """Counts jobs, tasks, agents and devices in four aggregate queries."""
    now = now or utcnow()
    counts = ClusterCounts()
    counts.jobs_by_state = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    counts.tasks_by_state = dict(
        session.execute(
            select(Task.state, func.count()).where(Task.state.in_(LIVE_TASK_STATES)).group_by(Task.state)
        ).all()
    )

    online = Agent.removed_at.is_(None) & Agent.online_until.is_not(None) & (Agent.online_until > now)
    # services.fleet.agents.agent_state as SQL: removed, online, stopped (said goodbye), else lost.
    liveness = case(
        (Agent.removed_at.is_not(None), "removed"),
        (online, "online"),
        (Agent.stopped_at.is_not(None), "stopped"),
        else_="lost",
    ).label("liveness")
    # An agent's devices are all of one kind (the first names it, as in services.fleet.agents.device_kind).
    kind = func.coalesce(Agent.devices[0]["kind"].as_string(), "cpu").label("kind")
    device_count = func.coalesce(func.json_array_length(Agent.devices), 0)
    rows = session.execute(
        select(liveness, kind, func.count(), func.sum(device_count)).group_by(liveness, kind)
    ).all()
    for state, device_kind, agents, devices in rows:
        counts.agents_by_liveness[state] = counts.agents_by_liveness.get(state, 0) + agents
        if state == "online":
            counts.devices_by_kind[device_kind] = counts.devices_by_kind.get(device_kind, 0) + int(
                devices or 0
            )

    held = func.sum(func.coalesce(func.json_array_length(Task.device_indices), 0), type_=Integer)
    counts.devices_used_by_kind = {
        device_kind: int(used or 0)
        for device_kind, used in session.execute(
            select(Task.device_kind, held)
            .join(Agent, Agent.id == Task.agent_id)
            .where(Task.state.in_(DEVICE_HOLDING_TASK_STATES), online)
            .group_by(Task.device_kind)
        ).all()
    }
    return counts


def count_sharing(session: Session) -> SharingCounts:
    """Counts the queue by team and band, the devices each team holds and the quotas in three queries."""
    counts = SharingCounts()
    band = case(
        (Job.priority < NORMAL_PRIORITY_FROM, "low"),
        (Job.priority < HIGH_PRIORITY_FROM, "normal"),
        else_="high",
    ).label("band")
    for team, band_name, jobs in session.execute(
        select(Job.team, band, func.count()).where(Job.state.in_(QUEUED_JOB_STATES)).group_by(Job.team, band)
    ).all():
        per_team = counts.queued.setdefault(team, {})
        per_team[band_name] = per_team.get(band_name, 0) + jobs

    # As services.scheduler.teams.usage (what quotas are checked against): a GPU task holds its GPUs, a CPU task
    # one slot, until it has ended (a LOST one until its agent confirms), wherever its agent is.
    is_gpu = Task.device_kind == "gpu"
    kind = case((is_gpu, "gpu"), else_="cpu").label("kind")
    held = func.sum(
        case((is_gpu, func.coalesce(func.json_array_length(Task.device_indices), 0)), else_=1), type_=Integer
    )
    for team, device_kind, used in session.execute(
        select(Job.team, kind, held)
        .join(Job, Job.id == Task.job_id)
        .where(Task.state.in_(DEVICE_HOLDING_TASK_STATES))
        .group_by(Job.team, kind)
    ).all():
        per_team = counts.in_use.setdefault(team, {})
        per_team[device_kind] = per_team.get(device_kind, 0) + int(used or 0)

    for team, gpus, cpu_slots in session.execute(
        select(TeamQuota.team, TeamQuota.gpus, TeamQuota.cpu_slots).limit(MAX_QUOTAS_COUNTED)
    ).all():
        caps = {"gpu": gpus, "cpu": cpu_slots}
        counts.quotas[team] = {device_kind: cap for device_kind, cap in caps.items() if cap is not None}
    return counts


def count_overview(session: Session) -> ClusterOverview:
    """The overview: devices as the agents list counts them (services.views.agents_view), jobs by state."""
    from mwms.server.services.views import agents_view  # views imports jobs -> teams -> states; kept local

    agents = agents_view(session)
    online = [a for a in agents if a.online]
    stopped = sum(1 for a in agents if a.state == "stopped")
    counts = dict(
        session.execute(
            select(Job.state, func.count())
            .where(Job.state.in_(_JOBS_RUNNING + _JOBS_PENDING))
            .group_by(Job.state)
        ).all()
    )
    return ClusterOverview(
        agents_online=len(online),
        agents_lost=len(agents) - len(online) - stopped,
        agents_stopped=stopped,
        devices_busy=sum(a.devices_used for a in online),
        devices_free=sum(a.devices_free for a in online),
        jobs_running=sum(counts.get(s, 0) for s in _JOBS_RUNNING),
        jobs_pending=sum(counts.get(s, 0) for s in _JOBS_PENDING),
    )
