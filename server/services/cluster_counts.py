"""What the cluster holds right now, counted in a fixed number of aggregate queries (Prometheus gauges),
and the dashboard's overview of it.

Four GROUP BY queries whatever the size: jobs by state (one pass over the state index: about 4 ms per
100,000 jobs in SQLite), live tasks by state (an index seek), agents by liveness and device kind, and
the devices that live tasks hold. Agents' liveness is
the same derived rule the API uses (online while now < online_until; the in-memory liveness is flushed
into online_until every reconciler pass, about once a second), so Grafana and the dashboard agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Integer, case, func, select
from sqlalchemy.orm import Session

from server.db.models import Agent, Job, Task, utcnow
from server.services.views import agents_view
from server.states import JobState, TaskState

# Tasks not ended: what the cluster runs now. Ended tasks are history (every attempt of every job) and
# would make each scrape read the whole table; jobs by state and the histograms cover what ended.
LIVE_TASK_STATES = [s.value for s in TaskState if not s.terminal]
# Tasks that hold their devices: not ended, or LOST until their agent confirms they ended (as placement).
DEVICE_HOLDING_TASK_STATES = [s.value for s in TaskState if not s.terminal] + [TaskState.LOST.value]


# The overview's job counts: only the live states are counted, a range of ix_jobs_state_created_id
# however many jobs finished.
_JOBS_RUNNING = [JobState.RUNNING.value, JobState.SCHEDULED.value]
_JOBS_PENDING = [JobState.PENDING.value, JobState.RESTARTING.value]


@dataclass(frozen=True)
class ClusterOverview:
    """Agents online/lost, devices of online agents busy/free, jobs running (or placed)/pending."""

    agents_online: int
    agents_lost: int
    devices_busy: int
    devices_free: int
    jobs_running: int
    jobs_pending: int


@dataclass
class ClusterCounts:
    jobs_by_state: dict[str, int] = field(default_factory=dict)
    tasks_by_state: dict[str, int] = field(default_factory=dict)  # live ones: ASSIGNED, STARTING, RUNNING
    agents_by_liveness: dict[str, int] = field(default_factory=dict)  # online, lost, removed
    # Devices of online agents, and those of them that live tasks hold, by kind ("gpu", "cpu").
    devices_by_kind: dict[str, int] = field(default_factory=dict)
    devices_used_by_kind: dict[str, int] = field(default_factory=dict)


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
    liveness = case((Agent.removed_at.is_not(None), "removed"), (online, "online"), else_="lost").label(
        "liveness"
    )
    # An agent's devices are all of one kind (the first names it, as in services.agents.device_kind).
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


def count_overview(session: Session) -> ClusterOverview:
    """The overview: devices as the agents list counts them (services.views.agents_view), jobs by state."""
    agents = agents_view(session)
    online = [a for a in agents if a.online]
    counts = dict(
        session.execute(
            select(Job.state, func.count())
            .where(Job.state.in_(_JOBS_RUNNING + _JOBS_PENDING))
            .group_by(Job.state)
        ).all()
    )
    return ClusterOverview(
        agents_online=len(online),
        agents_lost=len(agents) - len(online),
        devices_busy=sum(a.devices_used for a in online),
        devices_free=sum(a.devices_free for a in online),
        jobs_running=sum(counts.get(s, 0) for s in _JOBS_RUNNING),
        jobs_pending=sum(counts.get(s, 0) for s in _JOBS_PENDING),
    )
