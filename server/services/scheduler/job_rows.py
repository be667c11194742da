"""The jobs a scheduler pass plans with, read as plain rows, not ORM objects: the waiting jobs (with
their holds) and the running jobs whose tasks hold devices (server/services/scheduler/pass_inputs.py
gathers them into a pass's inputs).

A backlog of thousands of waiting jobs costs one query; a job whose row cannot be read is logged once,
counted and left out (mwms.server.poison.contain), not the pass.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, case, func, select, type_coerce
from sqlalchemy.orm import Session

from mwms.server.db.models import Attempt, Job, Preemption
from mwms.server.poison import contain
from mwms.server.services.fleet.agent_capacity import HoldingRow, holding_tasks
from mwms.server.services.job_life.jobs import NEVER_S
from mwms.server.services.json_values import hashable, parsed
from mwms.server.services.scheduler.queue_order import WaitingJob
from mwms.server.services.scheduler.queue_plan import RunningJob
from mwms.server.states import JobState

if TYPE_CHECKING:
    from mwms.server.services.scheduler.scheduling import SharingPolicy

log = logging.getLogger("mwms.server.scheduling")
WAITING_STATES = (JobState.PENDING.value, JobState.RESTARTING.value, JobState.PREEMPTING.value)


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


def read_running(
    session: Session,
    now: datetime,
    policy: SharingPolicy,
    memo: dict[Any, RunningJob] | None = None,
    holding: list[HoldingRow] | None = None,
) -> list[RunningJob]:
    """Every job whose tasks hold devices, with when it ends and whether it may be preempted now.

    The tasks, then their jobs and attempts once each (not once per task), with only the option values
    planning needs; a job whose row cannot be read is left out (and counted), not the pass. `memo`: the
    scheduler process's RunningJob of each job by the exact values it was built from (its rows as read
    now, its preemptions, whether its minimum run time has passed), replaced by this pass's jobs.
    `holding`: the pass's holding_tasks (server/services/fleet/agent_capacity.py), when it read them already.
    """
    tasks = holding_tasks(session) if holding is None else holding
    if not tasks:
        if memo is not None:
            memo.clear()
        return []
    per_job: dict[str, list[tuple[Any, ...]]] = {}
    for task in tasks:
        per_job.setdefault(task[0], []).append((*task[:4], hashable(task[4])))
    job_rows = {row[0]: row for row in session.execute(_running_jobs_query(session, set(per_job)))}
    attempt_ids = {t[1] for t in tasks}
    attempts = {
        row[0]: row
        for row in session.execute(
            select(
                Attempt.id, Attempt.state, Attempt.borrowed, type_coerce(Attempt.created_at, String)
            ).where(Attempt.id.in_(attempt_ids))
        )
    }
    recent, preempted_at = _preemptions(session, now)
    result = []
    kept: dict[Any, RunningJob] = {}
    for job_id, raw in per_job.items():
        try:
            job, attempt = job_rows[job_id], attempts[raw[0][1]]
            count, since = recent.get(job_id, 0), preempted_at.get(job_id)
            settled = (now - _aware(attempt[3])).total_seconds() >= policy.min_runtime_s
            key = (tuple(job), tuple(attempt), tuple(raw), count, since, settled, policy)
            running = memo.get(key) if memo is not None else None
            if running is None:
                running = _from_rows(job, attempt, raw, now, policy, count, since)
            kept[key] = running
            result.append(running)
        except Exception:  # noqa: BLE001 - one damaged row must not stall placement for everyone
            contain(log, "schedule_job", job_id, f"running job {job_id}")
    if memo is not None:
        memo.clear()
        memo.update(kept)
    return result


def _running_jobs_query(session: Session, job_ids: set[str]) -> Any:
    return select(
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


def _from_rows(
    job: Any,
    attempt: Any,
    tasks: list[tuple[Any, ...]],
    now: datetime,
    policy: SharingPolicy,
    recent: int,
    preempted_at: Any,
) -> RunningJob:
    """A RunningJob from its job and attempt rows and its tasks' (job, attempt, agent, kind, devices) rows."""
    devices: dict[str, list[int]] = {}
    placed: dict[str, int] = {}  # agent id -> its tasks there
    for _, _, agent_id, _, indices in tasks:
        devices.setdefault(agent_id, []).extend(parsed(indices))
        placed[agent_id] = placed.get(agent_id, 0) + 1
    return _running_job(job, attempt, tasks[0][3], devices, placed, now, policy, recent, preempted_at)


def _preemptions(session: Session, now: datetime) -> tuple[dict[str, int], dict[str, Any]]:
    """{job id: its preemptions in the last hour}, and {job id: when its unended preemption began}."""
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
    return recent, preempted_at


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
