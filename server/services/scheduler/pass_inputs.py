"""What a scheduler pass plans with (PlanInputs, server/services/scheduler/queue_plan.py), in a fixed
number of queries: the waiting jobs in queue order, the agents offered, cordoned and connecting, the
running jobs, each team's usage and quota, and the fair-share history. The jobs themselves are read as
plain rows (server/services/scheduler/job_rows.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent
from mwms.server.services.fleet.agent_capacity import holding_tasks
from mwms.server.services.fleet.agents import capacities
from mwms.server.services.scheduler import fair_share, teams
from mwms.server.services.scheduler.job_rows import read_running, read_waiting
from mwms.server.services.scheduler.placement import AgentCapacity
from mwms.server.services.scheduler.queue_order import WaitingJob, queue_order
from mwms.server.services.scheduler.queue_plan import PlanInputs, RunningJob

if TYPE_CHECKING:
    from mwms.server.services.scheduler.scheduling import SharingPolicy
    from mwms.server.services.scheduler.waiting_jobs import WaitingJobs


def read_inputs(
    session: Session,
    now: datetime,
    connected: frozenset[str] | None,
    policy: SharingPolicy,
    waiting_jobs: WaitingJobs | None = None,
    unless_same_as: Hashable | None = None,
    lap: Callable[[str], None] = lambda part: None,
) -> PlanInputs:
    """Everything a pass plans with, in a fixed number of queries.

    `waiting_jobs`: the coordinator's cache of waiting jobs (server/services/scheduler/waiting_jobs.py), which
    re-reads only the jobs that changed; without it every waiting job is read. `unless_same_as`: the
    key (PlanInputs.key) of a pass that decided nothing; when what was read is the same again, the
    inputs come back without an order (nothing to plan), and ordering is skipped. `lap` is told as each
    part ends (waiting, agents, running, others, order).
    """
    waiting = waiting_jobs.read(session, now) if waiting_jobs is not None else read_waiting(session, now)
    lap("waiting")
    if not waiting:
        return PlanInputs(order=[], offer=[], cordoned=[], running=[], usage={}, quotas={}, now=now)
    cordoned_ids = set(session.scalars(select(Agent.id).where(Agent.cordoned_at.is_not(None))).all())
    holding = holding_tasks(session)  # read once: they make the agents' capacities and the running jobs
    online = capacities(
        session, now, memo=waiting_jobs.agents_memo if waiting_jobs is not None else None, holding=holding
    )
    # An agent is online from its registration, and offered from its stream on: between the two (a
    # fraction of a second, or a coordinator start's reconnect grace) a job waits for it to connect.
    offered = [a for a in online if connected is None or a.agent_id in connected]
    connecting = [
        a
        for a in online
        if connected is not None and a.agent_id not in connected and a.agent_id not in cordoned_ids
    ]
    offer = [a for a in offered if a.agent_id not in cordoned_ids]
    cordoned = [a for a in offered if a.agent_id in cordoned_ids]
    lap("agents")
    running = read_running(
        session, now, policy, waiting_jobs.running_memo if waiting_jobs is not None else None, holding
    )
    lap("running")
    usage = _usage(running)
    quotas = {q.team: {"gpu": q.gpus, "cpu": q.cpu_slots} for q in teams.quotas(session).values()}
    history = (
        waiting_jobs.history(session, now)
        if waiting_jobs is not None
        else fair_share.read_history(session, now)
    )
    totals = _totals(offered)
    known = (
        [(a, n) for a, n in session.execute(select(Agent.id, Agent.name).where(Agent.removed_at.is_(None)))]
        if any(j.pinned for j in waiting)
        else []
    )
    key = (
        waiting_jobs.version if waiting_jobs is not None else None,
        tuple((a.agent_id, a.free_devices, a.used_ports, a.memory_bytes, a.memory_used) for a in offered),
        tuple(a.agent_id for a in connecting),  # a connecting agent that goes away changes reasons
        frozenset(cordoned_ids),
        _running_key(running, waiting),
        tuple(sorted((team, q["gpu"], q["cpu"]) for team, q in quotas.items())),
        fair_share.history_key(history),
    )
    lap("others")
    if waiting_jobs is not None and unless_same_as is not None and key == unless_same_as:
        return PlanInputs(order=[], offer=[], cordoned=[], running=[], usage={}, quotas={}, now=now, key=key)
    order = _ordered(waiting_jobs, waiting, usage, totals, quotas, history)
    lap("order")
    return PlanInputs(
        key=key,
        order=order,
        offer=offer,
        cordoned=cordoned,
        running=running,
        usage=usage,
        quotas=quotas,
        now=now,
        known_agents=known,
        connecting=connecting,
    )


def _ordered(
    waiting_jobs: WaitingJobs | None,
    waiting: list[WaitingJob],
    usage: Mapping[str, Mapping[str, int]],
    totals: Mapping[str, int],
    quotas: Mapping[str, Mapping[str, int | None]],
    history: Any,
) -> list[WaitingJob]:
    """queue_order(...), kept in the waiting-jobs cache while its inputs stay the same: a pass that plans
    again because an agent or a running job changed orders 10,000 jobs as the last one did."""
    if waiting_jobs is None:
        return queue_order(waiting, usage, totals, quotas, history)
    key = (
        waiting_jobs.version,
        tuple(sorted((team, tuple(sorted(used.items()))) for team, used in usage.items())),
        tuple(sorted(totals.items())),
        tuple(sorted((team, tuple(sorted(q.items()))) for team, q in quotas.items())),
        fair_share.history_key(history),
    )
    cached = waiting_jobs.order
    if cached is not None and cached[0] == key:
        return cached[1]
    order = queue_order(waiting, usage, totals, quotas, history, memo=waiting_jobs.team_runs)
    waiting_jobs.order = (key, order)
    return order


def _running_key(running: Iterable[RunningJob], waiting: Iterable[WaitingJob]) -> tuple[Any, ...]:
    """What of the running jobs a plan depends on. Whether one may be preempted counts only where a waiting
    job could preempt it (preemption_choice.may_preempt: a lower priority than the highest waiting, or
    borrowed): a job of the highest priority turning preemptable as its workers start made the scheduler
    plan 10,000 jobs again, to the same plan."""
    top = max((j.priority for j in waiting), default=None)
    return tuple(
        sorted(  # in no particular order as read: a task's state written moves it in its index
            (
                r.job_id,
                r.preemptable and top is not None and (r.priority < top or r.borrowed),
                r.ends_at,
                r.size,
            )
            for r in running
        )
    )


def _usage(running: Iterable[RunningJob]) -> dict[str, dict[str, int]]:
    used: dict[str, dict[str, int]] = {}
    for r in running:
        per_team = used.setdefault(r.team, {"gpu": 0, "cpu": 0})
        per_team[r.kind] += r.size
    return used


def _totals(agents: Iterable[AgentCapacity]) -> dict[str, int]:
    totals = {"gpu": 0, "cpu": 0}
    for a in agents:
        totals[a.device_kind] = totals.get(a.device_kind, 0) + len(a.all_devices)
    return totals
