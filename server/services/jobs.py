"""Jobs: creation, listing, cancellation, and what happens to a job when its tasks change state."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from server.db.models import Agent, Attempt, Bundle, Job, LogLine, Task, utcnow
from server.errors import Conflict, InvalidInput, NotFound
from server.observability.instruments import count_restart
from server.schemas import JobCreate, RestartOn
from server.services import telemetry
from server.services.agent_references import check_pins
from server.services.job_owners import check_job_owner
from server.services.transitions import transition_job, transition_task
from server.states import AttemptState, JobState, TaskState

FAILURE_LOG_LINES = 10
# A time limit this long is never reached; past it the datetime arithmetic would overflow instead.
NEVER_S = 100 * 365 * 86400.0
# A port can be busy by chance; a bundle or command that cannot start will not start on the next try either.
MAX_REFUSALS_IN_A_ROW = 5


def create_job(session: Session, spec: JobCreate, submitted_by: str = "") -> Job:
    """Stores a new PENDING job for the user `submitted_by`; the scheduler places it."""
    if session.get(Bundle, spec.bundle_digest) is None:
        raise InvalidInput(
            f"unknown bundle digest {spec.bundle_digest}: upload the program with POST /api/v1/bundles "
            "and use the digest it returns"
        )
    check_pins(session, spec.agents)
    job = Job(
        name=(spec.name or spec.command[-1])[:200],
        state="",
        bundle_digest=spec.bundle_digest,
        command=list(spec.command),
        env=dict(spec.env),
        num_workers=spec.workers,
        gpus_per_worker=spec.gpus_per_worker,
        submitted_by=submitted_by,
        options={
            "communication": spec.communication.model_dump(mode="json"),
            "restart": spec.restart.model_dump(mode="json"),
            "startup_timeout_seconds": spec.startup_timeout_seconds,
            "max_runtime_seconds": spec.max_runtime_seconds,
            "hang_timeout_seconds": spec.hang_timeout_seconds,
            "preflight": spec.preflight,
            "agents": spec.agents,
        },
    )
    session.add(job)
    session.flush()
    transition_job(session, job, JobState.PENDING, "waiting to be placed")
    return job


def get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id}; list jobs with GET /api/v1/jobs or `mwms jobs`")
    return job


def check_task_and_attempt(job: Job, task_index: int | None, attempt: int | None) -> None:
    """NotFound, saying what exists, for a task index or attempt number the job does not have."""
    if task_index is not None and not 0 <= task_index < job.num_workers:
        raise NotFound(f"job {job.id} has tasks 0-{job.num_workers - 1}; there is no task {task_index}")
    if attempt is not None and not 1 <= attempt <= max(1, len(job.attempts)):
        raise NotFound(
            f"job {job.id} has attempts 1-{max(1, len(job.attempts))}; there is no attempt {attempt}"
        )


@dataclass(frozen=True)
class JobListing:
    """One row of the jobs list: the job, how many attempts it has had, and its latest progress."""

    job: Job
    attempts: int
    progress: telemetry.Progress


def list_jobs(
    session: Session, states: list[JobState], offset: int, limit: int
) -> tuple[list[JobListing], int]:
    """Jobs newest first, optionally filtered by state, with the total count for paging.

    Two queries whatever the page size: the total, then the page with each job's attempt count and
    progress as correlated subqueries. The page's ids come from ix_jobs_created_id or
    ix_jobs_state_created_id (created_at, id, newest first), so an offset walks an index, never a sort.
    """
    matching = [Job.state.in_([s.value for s in states])] if states else []
    total = session.scalar(select(func.count()).select_from(Job).where(*matching)) or 0
    newest_first = (Job.created_at.desc(), Job.id.desc())
    page = select(Job.id).where(*matching).order_by(*newest_first).offset(offset).limit(limit).subquery()
    attempts = select(func.count(Attempt.id)).where(Attempt.job_id == Job.id).scalar_subquery()
    progress = telemetry.progress_columns(Job.id)
    rows = session.execute(
        select(Job, attempts, *progress.all()).join(page, page.c.id == Job.id).order_by(*newest_first)
    ).all()
    return [
        JobListing(job, count, telemetry.progress_out(step, loss_id, loss_value))
        for job, count, step, loss_id, loss_value in rows
    ], total


def read_job(session: Session, job_id: str) -> Job:
    """A job to show in full: its attempts, their tasks and its events loaded in a fixed number of queries."""
    job = session.scalars(
        select(Job)
        .where(Job.id == job_id)
        .options(selectinload(Job.attempts).selectinload(Attempt.tasks), selectinload(Job.events))
    ).one_or_none()
    if job is None:
        raise NotFound(f"no job with id {job_id}; list jobs with GET /api/v1/jobs or `mwms jobs`")
    return job


def time_limit(job: Job, key: str, default: float | None = None) -> float | None:
    """A stored time limit in seconds (`key` of job.options), `default` when unset, None when never reached.

    +Infinity or anything over NEVER_S is no limit. A value that is no positive number (a damaged row)
    raises ValueError, which the reconciler contains to this job.
    """
    value = job.options.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(f"job {job.id} has {key}={value!r}, which is not a positive number of seconds")
    return None if value > NEVER_S else float(value)


def fail_on_nan_names(job: Job) -> list[str]:
    """Metric names whose NaN value fails the job at once (restart.fail_on_nan)."""
    names = job.options.get("restart", {}).get("fail_on_nan") or []
    if isinstance(names, str):
        return [names]
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def fail_on_nan_metric(
    session: Session, job: Job, task: Task, name: str, step: int, now: datetime | None = None
) -> bool:
    """restart.fail_on_nan: a NaN value of a named metric from the current attempt fails the job, no restart.

    Returns True when the job was failed (its tasks are asked to stop).
    """
    if name not in fail_on_nan_names(job) or JobState(job.state).terminal:
        return False
    attempt = current_attempt(job)
    if attempt is None or attempt.id != task.attempt_id or attempt.state != AttemptState.ACTIVE.value:
        return False
    end_job(
        session,
        job,
        JobState.FAILED,
        f"metric {name!r} was NaN at step {step} in attempt {attempt.number}; restart.fail_on_nan "
        "fails the job without a restart",
        now,
    )
    return True


def current_attempt(job: Job) -> Attempt | None:
    return job.attempts[-1] if job.attempts else None


def job_env(job: Job) -> dict[str, str]:
    """The environment every task of the job gets on top of the agent's, communication options included."""
    env = dict(job.env)
    comm = job.options.get("communication", {})
    if comm.get("implementation"):
        env["MWMS_COMMUNICATION"] = comm["implementation"]
    if comm.get("timeout_seconds") is not None:
        env["MWMS_COLLECTIVE_TIMEOUT_S"] = str(comm["timeout_seconds"])
    if comm.get("bytes_per_pack") is not None:
        env["MWMS_BYTES_PER_PACK"] = str(comm["bytes_per_pack"])
    return env


def request_stop(task: Task, reason: str) -> None:
    """Asks the task's agent to stop it; the agent's report ends the task."""
    if not TaskState(task.state).terminal and not task.stop_requested:
        task.stop_requested = True
        task.stop_reason = reason


def cancel_job(
    session: Session, job_id: str, by: str = "", any_owner: bool = True, now: datetime | None = None
) -> Job:
    """Cancels a job in any non-final state and stops its tasks.

    `by` is the user who cancels; unless `any_owner` (admins), only the user who submitted the job may.
    """
    job = get_job(session, job_id)
    check_job_owner(job, by, any_owner, "cancel it")
    if JobState(job.state).terminal:
        raise Conflict(f"job {job.id} is already {job.state}; there is nothing to cancel")
    job.cancelled_by = by
    end_job(session, job, JobState.CANCELLED, f"cancelled by {by}" if by else "cancelled by user", now)
    return job


def end_job(session: Session, job: Job, final: JobState, reason: str, now: datetime | None = None) -> None:
    """Ends a job now (cancel, runtime limit): stops every task of its current attempt."""
    attempt = current_attempt(job)
    if attempt is not None:
        for task in attempt.tasks:
            request_stop(task, reason)
            if task.state == TaskState.ASSIGNED.value and _agent_is_gone(session, task):
                transition_task(session, task, TaskState.STOPPED, reason, now)
        outcome = AttemptState.CANCELLED if final == JobState.CANCELLED else AttemptState.FAILED
        _end_attempt_record(attempt, outcome, reason, now)
    transition_job(session, job, final, reason, now)


def _agent_is_gone(session: Session, task: Task) -> bool:
    agent = session.get(Agent, task.agent_id)
    return agent is None or agent.lost_at is not None


def _end_attempt_record(attempt: Attempt, state: AttemptState, reason: str, now: datetime | None) -> None:
    if attempt.state == AttemptState.ACTIVE.value:
        attempt.state = state.value
        attempt.reason = reason
        attempt.ended_at = now or utcnow()


def last_log_lines(session: Session, task: Task, count: int = FAILURE_LOG_LINES) -> list[str]:
    rows = session.scalars(
        select(LogLine.text).where(LogLine.task_id == task.id).order_by(LogLine.seq.desc()).limit(count)
    ).all()
    return list(reversed(rows))


def is_retryable(exit_code: int | None, lost: bool, restart_on: str) -> bool:
    """Lost agents and exit codes >= 128 (signals, OOM kills) are retryable; 1-127 only with restart_on=any."""
    if lost or exit_code is None:
        return True
    if restart_on == RestartOn.ANY.value:
        return exit_code != 0
    return exit_code >= 128 or exit_code < 0


def restart_backoff(base_s: float, restarts_done: int) -> float:
    """Seconds to wait before restart number `restarts_done + 1`: doubling, capped at 60 s."""
    return min(60.0, base_s * (2**restarts_done))


def fail_attempt(
    session: Session,
    job: Job,
    attempt: Attempt,
    reason: str,
    *,
    retryable: bool,
    backoff_base_s: float,
    now: datetime | None = None,
    log_tail: list[str] | None = None,
    cause: str = "other",
) -> None:
    """Ends an attempt after a failure: stops any task still running, then restarts or fails the job.

    The reason people read is `reason`, then what happens next, then the failing task's last log lines.
    `cause` labels a restart in mwms_job_restarts_total (server.observability.instruments.RESTART_CAUSES).
    """
    now = now or utcnow()
    if attempt.state != AttemptState.ACTIVE.value:
        return
    for task in attempt.tasks:
        request_stop(task, f"attempt {attempt.number} ended: another task failed")
    tail = ("\nlast log lines:\n" + "\n".join(log_tail)) if log_tail else ""
    _end_attempt_record(attempt, AttemptState.FAILED, reason + tail, now)
    if JobState(job.state).terminal:
        return
    policy = job.options.get("restart", {})
    max_restarts = int(policy.get("max_restarts", 3))
    if retryable and job.restarts < max_restarts:
        delay = restart_backoff(backoff_base_s, job.restarts)
        job.restarts += 1
        job.not_before = now + timedelta(seconds=delay)
        count_restart(session, cause)
        transition_job(
            session,
            job,
            JobState.RESTARTING,
            f"{reason}; restart {job.restarts} of {max_restarts} in {delay:.0f} s{tail}",
            now,
        )
        return
    suffix = (
        "" if retryable else " (not retryable: exit codes 1-127 are permanent unless restart_on is 'any')"
    )
    if retryable and max_restarts:
        suffix = f" (all {max_restarts} restarts used)"
    transition_job(session, job, JobState.FAILED, reason + suffix + tail, now)


def replace_attempt(session: Session, job: Job, attempt: Attempt, reason: str, now: datetime | None) -> None:
    """An agent could not start its task: drop the attempt and place the job again, not as a restart."""
    for task in attempt.tasks:
        request_stop(task, "attempt is being placed again")
    _end_attempt_record(attempt, AttemptState.REPLACED, reason, now)
    # Tasks are refused only before they run, so the job is still SCHEDULED (unless it was cancelled).
    if job.state != JobState.SCHEDULED.value:
        return
    refusals = 0
    for earlier in reversed(job.attempts):
        if earlier.state != AttemptState.REPLACED.value:
            break
        refusals += 1
    if refusals >= MAX_REFUSALS_IN_A_ROW:
        transition_job(
            session,
            job,
            JobState.FAILED,
            f"{reason}; agents refused to start this job {refusals} times in a row: fix the cause and submit again",
            now,
        )
        return
    transition_job(session, job, JobState.PENDING, f"{reason}; placing the job again", now)


def describe_task_failure(session: Session, task: Task, agent_name: str) -> tuple[str, list[str]]:
    """('task 1 on agent X: exited with code 3', its last log lines)."""
    head = f"task {task.index} on agent {agent_name}: " + (
        task.message or f"exited with code {task.exit_code}"
    )
    return head, last_log_lines(session, task)
