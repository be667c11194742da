"""Jobs: submit, list, read and cancel; the options a job was stored with (time limits, environment).

What a job or attempt becomes next is decided in server/services/job_life/lifecycle.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from mwms import environment_lock, task_environment
from mwms.server.db.models import Attempt, Bundle, Job, JobEvent
from mwms.server.errors import Conflict, Forbidden, InvalidInput, NotFound
from mwms.server.schemas import EnvironmentIn, JobCreate
from mwms.server.services.auth.job_owners import check_job_owner
from mwms.server.services.fleet.agent_references import check_pins
from mwms.server.services.job_life.lifecycle import (
    current_attempt as current_attempt,  # read here by services.observing.stacks
)
from mwms.server.services.job_life.lifecycle import end_job
from mwms.server.services.job_life.transitions import transition_job
from mwms.server.services.observing import telemetry
from mwms.server.services.scheduler import teams
from mwms.server.services.scheduler.submit_capacity import impossible_reason, registered_agents
from mwms.server.states import JobState

# A time limit this long is never reached; past it the datetime arithmetic would overflow instead.
NEVER_S = 100 * 365 * 86400.0


@dataclass(frozen=True)
class SubmitPolicy:
    """What the submitter may ask for (server/settings.py's sharing section, the caller's role).

    The default is an admin's: any priority, may opt out of preemption. `refuse_impossible`: refuse (409)
    a job that no set of the registered agents can ever hold (server/services/scheduler/submit_capacity.py), as the
    API does; off for callers that store jobs before their agents exist.
    """

    priority_ceiling: int | None = None  # None: no ceiling (admins)
    may_opt_out_of_preemption: bool = True
    max_preemption_grace_s: int = 3600
    refuse_impossible: bool = False

    def check(self, priority: int, preemptible: bool, grace_s: int | None) -> None:
        """Forbidden for what the role may not ask, InvalidInput for a grace over the coordinator's limit."""
        if self.priority_ceiling is not None and priority > self.priority_ceiling:
            raise Forbidden(
                f"priority {priority} is above {self.priority_ceiling}, the most a user may give "
                "(MWMS_USER_PRIORITY_CEILING); submit at or below it, or ask an admin"
            )
        if not preemptible and not self.may_opt_out_of_preemption:
            raise Forbidden(
                "only admins may submit a job with preemptible=false on this coordinator "
                "(MWMS_USERS_MAY_OPT_OUT_OF_PREEMPTION=false); drop it, or ask an admin"
            )
        if grace_s is not None and grace_s > self.max_preemption_grace_s:
            raise InvalidInput(
                f"preemption_grace_seconds={grace_s} is over this coordinator's limit of "
                f"{self.max_preemption_grace_s} (MWMS_MAX_PREEMPTION_GRACE_S)"
            )


def create_job(
    session: Session, spec: JobCreate, submitted_by: str = "", policy: SubmitPolicy | None = None
) -> Job:
    """Stores a new PENDING job for the user `submitted_by`; the scheduler places it.

    The job counts against the submitter's team as it is now (server/services/scheduler/teams.py).
    """
    (policy or SubmitPolicy()).check(spec.priority, spec.preemptible, spec.preemption_grace_seconds)
    if session.get(Bundle, spec.bundle_digest) is None:
        # 404 like every other unknown resource a request names (a schema-valid digest no bundle has).
        raise NotFound(
            f"unknown bundle digest {spec.bundle_digest}: upload the program with POST /api/v1/bundles "
            "and use the digest it returns"
        )
    check_pins(session, spec.agents)
    if policy is not None and policy.refuse_impossible:
        why = impossible_reason(
            registered_agents(session),
            spec.workers,
            spec.gpus_per_worker,
            spec.agents,
            memory_per_worker=spec.memory_per_worker or 0,
        )
        if why is not None:
            raise Conflict(f"this job can never be placed: {why}")
    job = Job(
        name=(spec.name or spec.command[-1])[:200],
        state="",
        bundle_digest=spec.bundle_digest,
        command=list(spec.command),
        env=dict(spec.env),
        num_workers=spec.workers,
        gpus_per_worker=spec.gpus_per_worker,
        memory_per_worker=spec.memory_per_worker,
        cpus_per_worker=spec.cpus_per_worker,
        submitted_by=submitted_by,
        team=teams.team_of(session, submitted_by),
        priority=spec.priority,
        preemptible=spec.preemptible,
        options={
            "communication": spec.communication.model_dump(mode="json"),
            "restart": spec.restart.model_dump(mode="json"),
            "startup_timeout_seconds": spec.startup_timeout_seconds,
            "max_runtime_seconds": spec.max_runtime_seconds,
            "hang_timeout_seconds": spec.hang_timeout_seconds,
            "preflight": spec.preflight,
            "agents": spec.agents,
            "preemption_grace_seconds": spec.preemption_grace_seconds,
        },
        environment=stored_environment(spec.environment),
    )
    session.add(job)
    session.flush()
    transition_job(session, job, JobState.PENDING, "waiting to be placed")
    return job


def spec_as_stored(job: Job) -> dict[str, Any]:
    """The spec fields `job` keeps, named as JobCreate names them and valued as `create_job` stored them
    (the one place that knows both): what an idempotent resend is compared with. `name` is left out
    (without one the job was named after its command)."""
    environment = dict(job.environment) if job.environment else None
    if environment is not None:
        environment.pop("packages", None)  # derived from the lock, never sent
        environment.setdefault("isolated", False)  # jobs stored before the field
    return {
        "bundle_digest": job.bundle_digest,
        "command": list(job.command),
        "env": dict(job.env),
        "workers": job.num_workers,
        "gpus_per_worker": job.gpus_per_worker,
        "memory_per_worker": job.memory_per_worker,
        "cpus_per_worker": job.cpus_per_worker,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "environment": environment,
        **job.options,
    }


def stored_environment(environment: EnvironmentIn | None) -> dict[str, Any] | None:
    """What the job keeps of its environment: as submitted, with its packages listed once for the views."""
    if environment is None:
        return None
    return {
        "requirements": environment.requirements,
        "python": environment.python,
        "locked": environment.locked,
        "isolated": environment.isolated,
        "packages": environment_lock.pinned_packages(environment.locked),
    }


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
    """A job to show in full, with its events; its attempts are read with `newest_attempts`."""
    job = session.scalars(select(Job).where(Job.id == job_id).options(selectinload(Job.events))).one_or_none()
    if job is None:
        raise NotFound(f"no job with id {job_id}; list jobs with GET /api/v1/jobs or `mwms jobs`")
    return job


def newest_attempts(session: Session, job_id: str, count: int) -> tuple[list[Attempt], int]:
    """The job's newest `count` attempts, oldest first, with their tasks and events (three queries), and how
    many it has: a 64-worker job that failed 1,000 times holds 64,000 tasks, and reading them all made one
    GET /jobs/{id} cost 4-5 s of the coordinator's CPU on a slow day."""
    attempts = session.scalars(
        select(Attempt)
        .where(Attempt.job_id == job_id)
        .order_by(Attempt.number.desc())
        .limit(count)
        .options(selectinload(Attempt.tasks), selectinload(Attempt.events))
    ).all()
    total = session.scalar(select(func.count()).select_from(Attempt).where(Attempt.job_id == job_id)) or 0
    return list(reversed(attempts)), total


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


def job_env(job: Job) -> dict[str, str]:
    """The environment every task of the job gets on top of the agent's, communication options included."""
    env = dict(job.env)
    comm = job.options.get("communication", {})
    if comm.get("implementation"):
        env[task_environment.COMMUNICATION] = comm["implementation"]
    if comm.get("timeout_seconds") is not None:
        env[task_environment.COLLECTIVE_TIMEOUT_S] = str(comm["timeout_seconds"])
    if comm.get("bytes_per_pack") is not None:
        env[task_environment.BYTES_PER_PACK] = str(comm["bytes_per_pack"])
    if job.options.get("preemption_grace_seconds") is not None:
        env[task_environment.PREEMPTION_GRACE_S] = str(job.options["preemption_grace_seconds"])
    return env


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


def set_priority(
    session: Session, job_id: str, priority: int, by: str, policy: SubmitPolicy, any_owner: bool
) -> Job:
    """Changes a waiting job's priority: its owner within the ceiling, admins (any_owner) freely."""
    job = get_job(session, job_id)
    check_job_owner(job, by, any_owner, "change its priority")
    if job.state not in (JobState.PENDING.value, JobState.RESTARTING.value):
        raise Conflict(
            f"job {job.id} is {job.state}: only a waiting (PENDING) job's priority can be changed; a running "
            "job keeps the priority it was placed with"
        )
    policy.check(priority, job.preemptible, None)
    if priority != job.priority:
        # Recorded like a state change (the state stays): the history shows it, and the scheduler's
        # cache of waiting jobs (server/services/scheduler/waiting_jobs.py) reads the job again.
        session.add(
            JobEvent(
                job_id=job.id,
                from_state=job.state,
                to_state=job.state,
                reason=f"priority changed from {job.priority} to {priority} by {by or 'an admin'}",
            )
        )
        job.priority = priority
    session.flush()
    return job
