"""The scheduler pass: read the cluster, plan (server/services/scheduler/queue_plan.py), apply the plan.

Restarts whose backoff has passed and preempted jobs whose workers have all exited go back to PENDING
first (the rules are in server/services/job_life/lifecycle.py). The waiting jobs are read as plain rows, not
ORM objects, so a backlog of thousands costs one query; only jobs the plan places or preempts are
loaded. Each placement and preemption is applied in its own savepoint (mwms.server.poison.isolated): a
job whose row cannot be handled is logged once, counted and skipped, and the others still are.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, bindparam, case, func, select, type_coerce, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Attempt, Job, Preemption, Task, utcnow
from mwms.server.observability.instruments import observe_queue_wait
from mwms.server.poison import contain, isolated
from mwms.server.services.fleet.agents import capacities
from mwms.server.services.job_life.jobs import NEVER_S
from mwms.server.services.job_life.lifecycle import (
    attempt_placed,
    open_attempt,
    preempt_job,
    release_preempted,
    release_restart,
)
from mwms.server.services.job_life.tf_config import build_tf_config
from mwms.server.services.json_values import as_text, parsed
from mwms.server.services.scheduler import device_claims, fair_share, pass_check, teams
from mwms.server.services.scheduler.placement import AgentCapacity, shared_agent_note
from mwms.server.services.scheduler.queue_order import WaitingJob, queue_order
from mwms.server.services.scheduler.queue_plan import (
    Placement,
    Plan,
    PlanInputs,
    PreemptionDecision,
    RunningJob,
    plan_pass,
)
from mwms.server.states import DEVICE_HOLDING_TASK_STATES, AttemptState, JobState, TaskState

if TYPE_CHECKING:
    from mwms.server.services.scheduler.waiting_jobs import WaitingJobs

log = logging.getLogger("mwms.server.scheduling")
WAITING_STATES = (JobState.PENDING.value, JobState.RESTARTING.value, JobState.PREEMPTING.value)
_RELEASABLE = (JobState.RESTARTING.value, JobState.PREEMPTING.value)


@dataclass(frozen=True)
class SharingPolicy:
    """The coordinator's preemption settings (server/settings.py, sharing section)."""

    grace_s: int = 30
    min_runtime_s: float = 60.0
    max_preemptions_per_hour: int = 4

    @classmethod
    def of(cls, settings: Any) -> SharingPolicy:
        return cls(
            grace_s=settings.preemption_grace_s,
            min_runtime_s=settings.preemption_min_runtime_s,
            max_preemptions_per_hour=settings.max_preemptions_per_hour,
        )


def release_waiting(session: Session, now: datetime) -> None:
    """RESTARTING jobs past their backoff, and PREEMPTING jobs whose tasks have all ended, become PENDING."""
    jobs = session.scalars(select(Job).where(Job.state.in_(_RELEASABLE))).all()
    for job in jobs:
        with isolated(session, log, "restart_job", job.id, f"release of job {job.id}"):
            if job.state == JobState.RESTARTING.value:
                release_restart(session, job, now)
            else:
                release_preempted(session, job, now)


def schedule_pending(
    session: Session,
    now: datetime | None = None,
    connected: frozenset[str] | None = None,
    policy: SharingPolicy | None = None,
) -> list[str]:
    """One pass in one transaction; returns the ids of agents that got tasks or stops.

    `connected`: when given, only agents with a live session are offered (see agents.capacities).
    """
    now = now or utcnow()
    policy = policy or SharingPolicy()
    release_waiting(session, now)
    inputs = read_inputs(session, now, connected, policy)
    if not inputs.order:
        return []
    plan = plan_pass(inputs)
    pass_check.check(inputs, plan)
    return apply_plan(session, inputs, plan, policy, now)


def schedule_pass(
    db: Database,
    now: datetime | None = None,
    connected: frozenset[str] | None = None,
    policy: SharingPolicy | None = None,
    waiting_jobs: WaitingJobs | None = None,
    phases: dict[str, float] | None = None,
) -> list[str]:
    """One pass as the coordinator runs it: it plans in a read transaction and takes the writer only to
    release waiting jobs and to apply the plan, so submits, reports and heartbeats wait at most for those.

    Only this loop places tasks, so what it read stays true but for tasks ending (which frees devices)
    and agents leaving or being cordoned; apply_plan checks those again before it places.
    `phases`, when given, receives the seconds each part took: release, read, plan, check, apply.
    """
    now = now or utcnow()
    policy = policy or SharingPolicy()
    clock = _Phases(phases)
    with db.read() as session:
        releasable = session.scalar(select(func.count()).select_from(Job).where(Job.state.in_(_RELEASABLE)))
    if releasable:
        with db.write() as session:
            release_waiting(session, now)
    clock.lap("release")
    quiet = waiting_jobs.quiet_key if waiting_jobs is not None else None
    with db.read() as session:
        inputs = read_inputs(session, now, connected, policy, waiting_jobs, unless_same_as=quiet)
        clock.lap("read")
        plan = plan_pass(inputs) if inputs.order else None
        clock.lap("plan")
        if plan is not None:
            pass_check.check(inputs, plan)
        clock.lap("check")
    decided = plan is not None and bool(plan.placements or plan.preemptions)
    touched: list[str] = []
    if plan is not None and (decided or _changed_reasons(inputs, plan)):
        with db.write() as session:
            touched = apply_plan(session, inputs, plan, policy, now)
    clock.lap("apply")
    if (
        waiting_jobs is not None
    ):  # a pass that placed and preempted nothing decides the same on the same inputs
        waiting_jobs.quiet_key = None if decided else inputs.key
    return touched


class _Phases:
    """Seconds per part of a pass, into `into` (nothing when None)."""

    def __init__(self, into: dict[str, float] | None) -> None:
        self._into = into
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self._into is None:
            return
        now = time.perf_counter()
        self._into[name] = self._into.get(name, 0.0) + now - self._last
        self._last = now


def apply_plan(
    session: Session, inputs: PlanInputs, plan: Plan, policy: SharingPolicy, now: datetime
) -> list[str]:
    """Places, preempts and stores reasons as `plan` says; returns the agents that got tasks or stops."""
    touched: set[str] = set()
    still_free = _still_free(session, plan.placements, now)
    names = {agent.agent_id: agent.name for agent in inputs.offer}
    for placement in plan.placements:
        if not still_free(placement):
            continue  # an agent left, was cordoned, or its device is taken: the next pass sees why
        with isolated(
            session, log, "schedule_job", placement.job.job_id, f"placement of job {placement.job.job_id}"
        ):
            touched.update(_apply_placement(session, placement, names, now))
    for decision in plan.preemptions:
        with isolated(
            session,
            log,
            "preempt_job",
            decision.preemptor.job_id,
            f"preemption for {decision.preemptor.job_id}",
        ):
            touched.update(_apply_preemption(session, decision, policy, now))
    placed = {p.job.job_id for p in plan.placements}
    _store_reasons(session, inputs.order, plan.waiting, placed)
    return sorted(touched)


def _changed_reasons(inputs: PlanInputs, plan: Plan) -> bool:
    return any(
        job.state == JobState.PENDING.value
        and job.job_id in plan.waiting
        and plan.waiting[job.job_id]["message"] != job.stored_reason
        for job in inputs.order
    )


def _still_free(session: Session, placements: list[Placement], now: datetime) -> Callable[[Placement], bool]:
    """A check that a placement's agents are still online, not removed or cordoned, and its devices free."""
    agent_ids = sorted({t.agent_id for p in placements for t in p.tasks})
    if not agent_ids:
        return lambda placement: True
    usable = set(
        session.scalars(
            select(Agent.id).where(
                Agent.id.in_(agent_ids),
                Agent.removed_at.is_(None),
                Agent.cordoned_at.is_(None),
                Agent.online_until > now,
            )
        ).all()
    )
    taken = {
        (agent_id, int(i))
        for agent_id, indices in session.execute(
            select(Task.agent_id, Task.device_indices).where(
                Task.agent_id.in_(agent_ids), Task.state.in_(DEVICE_HOLDING_TASK_STATES)
            )
        )
        for i in indices
    }

    def check(placement: Placement) -> bool:
        wanted = [(t.agent_id, i) for t in placement.tasks for i in t.device_indices]
        if any(t.agent_id not in usable for t in placement.tasks) or any(d in taken for d in wanted):
            return False
        taken.update(wanted)
        return True

    return check


# -- reading --------------------------------------------------------------------------------------------


def read_inputs(
    session: Session,
    now: datetime,
    connected: frozenset[str] | None,
    policy: SharingPolicy,
    waiting_jobs: WaitingJobs | None = None,
    unless_same_as: Hashable | None = None,
) -> PlanInputs:
    """Everything a pass plans with, in a fixed number of queries.

    `waiting_jobs`: the coordinator's cache of waiting jobs (server/services/scheduler/waiting_jobs.py), which
    re-reads only the jobs that changed; without it every waiting job is read. `unless_same_as`: the
    key (PlanInputs.key) of a pass that decided nothing; when what was read is the same again, the
    inputs come back without an order (nothing to plan), and ordering is skipped.
    """
    waiting = waiting_jobs.read(session, now) if waiting_jobs is not None else read_waiting(session, now)
    if not waiting:
        return PlanInputs(order=[], offer=[], cordoned=[], running=[], usage={}, quotas={}, now=now)
    cordoned_ids = set(session.scalars(select(Agent.id).where(Agent.cordoned_at.is_not(None))).all())
    online = capacities(session, now)
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
    running = read_running(session, now, policy)
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
        tuple((r.job_id, r.preemptable, r.ends_at, r.size) for r in running),
        tuple(sorted((team, q["gpu"], q["cpu"]) for team, q in quotas.items())),
        fair_share.history_key(history),
    )
    if waiting_jobs is not None and unless_same_as is not None and key == unless_same_as:
        return PlanInputs(order=[], offer=[], cordoned=[], running=[], usage={}, quotas={}, now=now, key=key)
    return PlanInputs(
        key=key,
        order=_ordered(waiting_jobs, waiting, usage, totals, quotas, history),
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
    order = queue_order(waiting, usage, totals, quotas, history)
    waiting_jobs.order = (key, order)
    return order


def _option(session: Session, name: str) -> Any:
    """One value of a job's options, as text or a number: a JSON path, so no row's whole options are decoded.

    On SQLite, where a damaged row's options may not be JSON at all, such a row reads NULL instead of
    failing the query (and with it every pass).
    """
    path = Job.options[name].as_string()
    if session.get_bind().dialect.name == "sqlite":
        path = case((func.json_valid(Job.options) == 1, path), else_=None)
    return type_coerce(path, String)


def read_waiting(session: Session, now: datetime, ids: Collection[str] | None = None) -> list[WaitingJob]:
    """Every PENDING, RESTARTING and PREEMPTING job (of `ids`, when given) as plain data.

    One query for all of them, reading only the option values planning needs (a JSON path each, so no
    row's whole options are decoded) and the reason text (what a pass compares before it writes);
    holds, which few jobs have, in a second.
    """
    rows = session.execute(
        select(
            Job.id,
            Job.state,
            Job.priority,
            Job.team,
            # Read as the driver gives them, without SQLAlchemy's per-row conversions (most of a pass's
            # cost at 10,000 waiting jobs): parsed in _waiting_job.
            type_coerce(Job.created_at, String),
            Job.num_workers,
            Job.gpus_per_worker,
            Job.preemptible,
            _option(session, "max_runtime_seconds"),
            _option(session, "agents"),
            Job.reason,
            Job.memory_per_worker,
        ).where(Job.state.in_(WAITING_STATES), *([Job.id.in_(list(ids))] if ids is not None else []))
    ).all()
    holds = read_holds(session, now)
    result = []
    for row in rows:
        try:
            result.append(_waiting_job(row, holds.get(row[0])))
        except Exception:  # noqa: BLE001 - one damaged job row must not stall placement for everyone
            contain(log, "schedule_job", row[0], f"job {row[0]}")
    return result


def read_holds(session: Session, now: datetime) -> dict[str, Any]:
    """{job id: hold} of the PENDING jobs whose hold (capacity kept for them while victims exit) is live."""
    return dict(
        session.execute(
            select(Job.id, Job.hold).where(Job.state == JobState.PENDING.value, Job.hold_until > now)
        ).all()
    )


def hold_of(value: Any) -> dict[str, tuple[int, ...]] | None:
    """A stored hold as planning reads it; None for none (or a damaged one)."""
    if not isinstance(value, dict) or not value:
        return None
    return {str(a): tuple(int(i) for i in d) for a, d in value.items()}


def _waiting_job(row: Any, hold: Any) -> WaitingJob:
    job_id, state, priority, team, created, workers, gpus, preemptible, runtime, pins_json, reason = row[:-1]
    memory = row[-1]  # memory_per_worker
    pins = json.loads(pins_json) if isinstance(pins_json, str) and pins_json.startswith("[") else None
    if not (isinstance(workers, int) and workers >= 1 and isinstance(gpus, int) and gpus >= 0):
        raise ValueError(f"job {job_id} has workers={workers!r}, gpus_per_worker={gpus!r}")
    return WaitingJob(
        job_id=job_id,
        state=state,
        priority=int(priority),
        team=team,
        created_at=_aware(created),
        workers=workers,
        gpus_per_worker=gpus,
        preemptible=bool(preemptible),
        pinned=tuple(str(p) for p in pins) if isinstance(pins, list) and pins else None,
        max_runtime_s=_seconds(runtime),
        hold={a: tuple(int(i) for i in d) for a, d in hold.items()}
        if isinstance(hold, dict) and hold
        else None,
        memory_per_worker=max(0, int(memory or 0)),
        stored_reason=reason,
    )


def _aware(value: Any) -> datetime:
    """A stored time as the driver returns it (a datetime, or SQLite's text), timezone-aware in UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise ValueError(f"not a time: {value!r}")
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _seconds(value: Any) -> float | None:
    """A stored time limit in seconds (a number, or its text from a JSON path), None when unset, not a
    positive number, or never reached."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 < value <= NEVER_S else None


def read_running(session: Session, now: datetime, policy: SharingPolicy) -> list[RunningJob]:
    """Every job whose tasks hold devices, with when it ends and whether it may be preempted now.

    The tasks, then their jobs and attempts once each (not once per task), with only the option values
    planning needs; a job whose row cannot be read is left out (and counted), not the pass.
    """
    tasks = session.execute(
        select(
            Task.job_id, Task.attempt_id, Task.agent_id, Task.device_kind, as_text(Task.device_indices)
        ).where(Task.state.in_(DEVICE_HOLDING_TASK_STATES))
    ).all()
    if not tasks:
        return []
    job_ids = {t.job_id for t in tasks}
    attempt_ids = {t.attempt_id for t in tasks}
    job_rows = {
        row[0]: row
        for row in session.execute(
            select(
                Job.id,
                Job.state,
                Job.priority,
                Job.team,
                Job.preemptible,
                _option(session, "preemption_grace_seconds"),
                _option(session, "max_runtime_seconds"),
                _option(session, "preempted_s"),
                type_coerce(Job.started_at, String),
                Job.memory_per_worker,
            ).where(Job.id.in_(job_ids))
        )
    }
    attempts = {
        row[0]: row
        for row in session.execute(
            select(
                Attempt.id, Attempt.state, Attempt.borrowed, type_coerce(Attempt.created_at, String)
            ).where(Attempt.id.in_(attempt_ids))
        )
    }
    recent = dict(
        session.execute(
            select(Preemption.victim_job_id, func.count(Preemption.id))
            .where(Preemption.at >= now - timedelta(hours=1))
            .group_by(Preemption.victim_job_id)
        ).all()
    )
    preempted_at = dict(
        session.execute(
            select(Preemption.victim_job_id, func.max(Preemption.at))
            .where(Preemption.ended_at.is_(None))
            .group_by(Preemption.victim_job_id)
        ).all()
    )
    devices: dict[str, dict[str, list[int]]] = {}
    placed: dict[str, dict[str, int]] = {}  # job id -> agent id -> its tasks there
    first: dict[str, Any] = {}
    for task in tasks:
        first.setdefault(task.job_id, task)
        devices.setdefault(task.job_id, {}).setdefault(task.agent_id, []).extend(parsed(task[4]))
        per_agent = placed.setdefault(task.job_id, {})
        per_agent[task.agent_id] = per_agent.get(task.agent_id, 0) + 1
    result = []
    for job_id, task in first.items():
        try:
            result.append(
                _running_job(
                    job_rows[job_id],
                    attempts[task.attempt_id],
                    task.device_kind,
                    devices[job_id],
                    placed[job_id],
                    now,
                    policy,
                    recent.get(job_id, 0),
                    preempted_at.get(job_id),
                )
            )
        except Exception:  # noqa: BLE001 - one damaged row must not stall placement for everyone
            contain(log, "schedule_job", job_id, f"running job {job_id}")
    return result


def _running_job(
    job: Any,
    attempt: Any,
    kind: str,
    devices: dict[str, list[int]],
    tasks_per_agent: dict[str, int],
    now: datetime,
    policy: SharingPolicy,
    recent_preemptions: int,
    preempted_at: datetime | None,
) -> RunningJob:
    job_id, job_state, priority, team, preemptible, grace, runtime, paused, started, memory = job
    per_worker = max(0, int(memory or 0))
    _, attempt_state, borrowed, attempt_created = attempt
    grace_s = int(float(grace)) if _seconds(grace) is not None or grace in (0, "0") else policy.grace_s
    grace_s = min(max(grace_s, 0), 3600)
    attempt_started = _aware(attempt_created)
    run_s = _seconds(runtime)
    if job_state == JobState.PREEMPTING.value and preempted_at is not None:
        ends_at: datetime | None = _aware(preempted_at) + timedelta(seconds=grace_s + 5)
    elif run_s is not None and started is not None:
        ends_at = _aware(started) + timedelta(seconds=run_s + (_seconds(paused) or 0.0))
    else:
        ends_at = None
    active = job_state == JobState.RUNNING.value and attempt_state == "ACTIVE"
    return RunningJob(
        job_id=job_id,
        priority=int(priority),
        team=team,
        kind="gpu" if kind == "gpu" else "cpu",
        devices={a: tuple(int(i) for i in d) for a, d in devices.items()},
        started_at=attempt_started,
        ends_at=ends_at,
        borrowed=bool(borrowed),
        preemptable=bool(
            active
            and preemptible
            and policy.max_preemptions_per_hour > recent_preemptions
            and (now - attempt_started).total_seconds() >= policy.min_runtime_s
        ),
        grace_s=grace_s,
        memory={a: n * per_worker for a, n in tasks_per_agent.items()} if per_worker else {},
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


# -- applying -------------------------------------------------------------------------------------------


def _apply_placement(
    session: Session, placement: Placement, names: Mapping[str, str], now: datetime
) -> list[str]:
    """Places one job, its device claims included; a device the database says is held (a plan made on
    a stale read) drops this placement alone, and the next pass plans again."""
    try:
        with session.begin_nested():
            return _place(session, placement, names, now)
    except IntegrityError as error:
        if not device_claims.is_conflict(error):
            raise
        log.warning(
            "job %s not placed: a device it was planned on is held (a stale plan)", placement.job.job_id
        )
        return []


def _place(session: Session, placement: Placement, names: Mapping[str, str], now: datetime) -> list[str]:
    """Opens the job's attempt with its tasks where `placement` says; `names`: agent id -> name."""
    job = session.get(Job, placement.job.job_id)
    if job is None or job.state != JobState.PENDING.value:
        return []
    waited_since = job.events[-1].at if job.events else job.created_at
    previous = job.attempts[-1] if job.attempts else None
    if previous is not None and previous.state == AttemptState.PREEMPTED.value and previous.ended_at:
        # Time spent preempted is not run time: max_runtime_seconds counts what the job ran.
        paused = float(job.options.get("preempted_s") or 0) + (now - previous.ended_at).total_seconds()
        job.options = {**job.options, "preempted_s": paused}
    attempt = open_attempt(session, job, now)
    attempt.borrowed = placement.borrowed
    endpoints = [p.endpoint for p in placement.tasks]
    for p in placement.tasks:
        attempt.tasks.append(
            Task(
                job_id=job.id,
                attempt_id=attempt.id,
                attempt_number=attempt.number,
                index=p.index,
                agent_id=p.agent_id,
                host=p.address,
                port=p.port,
                device_kind=p.device_kind,
                device_indices=list(p.device_indices),
                tf_config=build_tf_config(endpoints, p.index),
                state=TaskState.ASSIGNED.value,
            )
        )
    job.hold, job.hold_until, job.waiting = None, None, {}
    session.flush()
    device_claims.claim(session, attempt.tasks)
    agents = sorted({p.agent_id for p in placement.tasks})
    attempt_placed(session, job, attempt, endpoints, agents, now, shared_agent_note(placement.tasks, names))
    if placement.borrowed:
        job.reason += f"; borrowing idle capacity over team {job.team!r}'s quota (reclaimed first)"
    observe_queue_wait(session, job.priority, (now - waited_since).total_seconds())
    return agents


def _apply_preemption(
    session: Session, decision: PreemptionDecision, policy: SharingPolicy, now: datetime
) -> list[str]:
    preemptor = session.get(Job, decision.preemptor.job_id)
    if preemptor is None or preemptor.state != JobState.PENDING.value:
        return []
    touched: set[str] = set()
    for victim in decision.victims:
        job = session.get(Job, victim.job_id)
        if job is None:
            continue
        why = (
            f"job {preemptor.id} of priority {preemptor.priority} needs its devices"
            if decision.cause == "priority"
            else f"team {preemptor.team!r} reclaims its quota for job {preemptor.id} (this job borrowed it)"
        )
        if preempt_job(session, job, decision.cause, why, victim.grace_s, preemptor, now):
            touched.update(victim.devices)
    preemptor.hold = {a: list(d) for a, d in decision.hold.items()}
    preemptor.hold_until = now + timedelta(seconds=decision.hold_s)
    return sorted(touched)


def _store_reasons(
    session: Session, order: Iterable[WaitingJob], reasons: dict[str, dict[str, Any]], placed: set[str]
) -> None:
    """Writes each waiting job's typed reason (and its text as `reason`) where it changed, in one batch."""
    changes = []
    for job in order:
        if job.job_id in placed or job.state != JobState.PENDING.value:
            continue
        reason = reasons.get(job.job_id)
        if reason is None or job.stored_reason == reason["message"]:
            continue
        changes.append({"job": job.job_id, "new_waiting": reason, "new_reason": reason["message"]})
        job.stored_reason = reason["message"]  # what a cached WaitingJob compares with next pass
    if changes:
        # Only jobs still PENDING: one cancelled since the pass read it keeps the reason it ended with.
        statement = (
            update(Job)
            .where(Job.id == bindparam("job"), Job.state == JobState.PENDING.value)
            .values(waiting=bindparam("new_waiting"), reason=bindparam("new_reason"))
        )
        session.connection().execute(statement, changes)
