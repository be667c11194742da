"""Shapes database rows and service views into the API's response models; it runs no queries."""

from __future__ import annotations

import math
from typing import Any

from mwms.server.db.models import Attempt, AttemptEvent, Job, StoredFile, Task, Token
from mwms.server.schemas import (
    AgentOut,
    AgentTaskOut,
    ArtifactOut,
    AttemptEndingOut,
    AttemptEventOut,
    AttemptOut,
    CommunicationOptions,
    DeviceOut,
    EnvironmentOut,
    JobEventOut,
    JobOut,
    JobSummary,
    LogLineOut,
    RestartPolicy,
    TaskOut,
    TokenOut,
    WarmPoolOut,
)
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.jobs import JobListing
from mwms.server.services.observing.log_pages import LogEntry
from mwms.server.services.observing.telemetry import Progress
from mwms.server.services.views import AgentView, JobView
from mwms.server.states import JobState

# The endings that name the task whose own failure (or lost agent) ended the attempt.
FAILED_TASK_ENDINGS = ("task_failed", "agent_lost")


def failed_task_index(attempt: Attempt) -> int | None:
    """The index of the task whose failure ended `attempt` (its ending's `task`); None for other endings."""
    if attempt.ended_at is None:
        return None
    ending = next((e for e in reversed(list(attempt.events)) if e.to_state == attempt.state), None)
    if ending is None or ending.cause not in FAILED_TASK_ENDINGS:
        return None
    index = (ending.details or {}).get("task")
    return index if isinstance(index, int) else None


def task_out(task: Task, view: JobView, failed_task: int | None = None) -> TaskOut:
    """A task of `view`'s job, with its agent's name and its GPUs' UUIDs; `failed_task`: the index of the
    task whose failure ended its attempt."""
    return TaskOut(
        id=task.id,
        index=task.index,
        attempt=task.attempt_number,
        agent_id=task.agent_id,
        agent_name=view.agent_names.get(task.agent_id, task.agent_id),
        address=f"{task.host}:{task.port}",
        state=task.state,
        exit_code=task.exit_code,
        message=task.message,
        pid=task.pid,
        device_kind=task.device_kind,
        device_indices=list(task.device_indices),
        device_uuids=view.device_uuids(task),
        tf_config=task.tf_config,
        started_at=task.started_at,
        ended_at=task.ended_at,
        environment=task.environment,
        environment_build_seconds=task.environment_build_s,
        peak_memory_bytes=task.peak_memory_bytes,
        memory_limit_bytes=task.memory_limit_bytes,
        ended_attempt=failed_task == task.index,
    )


def job_summary(job: Job, attempts: int, progress: Progress) -> JobSummary:
    """A job as the jobs list shows it; the attempt count and progress come from the list's own query."""
    step, loss = progress
    return JobSummary(
        id=job.id,
        name=job.name,
        state=JobState(job.state),
        reason=job.reason,
        workers=job.num_workers,
        gpus_per_worker=job.gpus_per_worker,
        memory_per_worker=job.memory_per_worker,
        cpus_per_worker=job.cpus_per_worker,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempts=attempts,
        restarts=job.restarts,
        step=step,
        loss=loss,
        submitted_by=job.submitted_by,
        cancelled_by=job.cancelled_by,
        team=job.team,
        priority=job.priority,
        preemptible=job.preemptible,
        waiting=dict(job.waiting or {}),
    )


# Details shown as fields of their own in AttemptEndingOut, with the type each must have.
_ENDING_FIELDS: dict[str, type] = {
    "job_id": str,
    "priority": int,
    "team": str,
    "agent": str,
    "agent_id": str,
    "task": int,
    "exit_code": int,
    "by": str,
    "restart": int,
    "restart_cause": str,
}


def ending_out(attempt: Attempt, event: AttemptEvent | None) -> AttemptEndingOut:
    """How the attempt ended, from its ending event (None or one without a cause: unrecorded)."""
    kind = event.cause if event is not None and event.cause else attempt_endings.UNRECORDED
    details = dict(event.details or {}) if event is not None and event.cause else {}
    found = {name: details.pop(name, None) for name in _ENDING_FIELDS}  # a damaged value is left out
    lifted: dict[str, Any] = {
        name: value
        for name, value in found.items()
        if isinstance(value, _ENDING_FIELDS[name]) and not isinstance(value, bool)
    }
    message = attempt_endings.describe(kind, {**details, **lifted}, attempt.reason or attempt.state.lower())
    return AttemptEndingOut(kind=kind, message=message, details=details, **lifted)


def attempt_out(attempt: Attempt, view: JobView) -> AttemptOut:
    """An attempt with its tasks, its events and, once it has ended, why and through whom."""
    events = list(attempt.events)
    ending = next((e for e in reversed(events) if e.to_state == attempt.state), None)
    return AttemptOut(
        number=attempt.number,
        state=attempt.state,
        reason=attempt.reason,
        created_at=attempt.created_at,
        ended_at=attempt.ended_at,
        tasks=[task_out(t, view, failed_task_index(attempt)) for t in attempt.tasks],
        ended=ending_out(attempt, ending) if attempt.ended_at is not None else None,
        events=[
            AttemptEventOut(
                from_state=e.from_state, to_state=e.to_state, reason=e.reason, at=e.at, cause=e.cause
            )
            for e in events
        ],
    )


def _finite_values(stored: dict[str, Any]) -> dict[str, Any]:
    # Jobs stored before timeouts had to be finite may hold Infinity: show such a value as unset.
    return {k: v for k, v in stored.items() if not (isinstance(v, float) and not math.isfinite(v))}


def job_listing_out(listing: JobListing) -> JobSummary:
    return job_summary(listing.job, listing.attempts, listing.progress)


def environment_out(stored: dict[str, Any] | None) -> EnvironmentOut | None:
    if not stored:
        return None
    return EnvironmentOut(
        requirements=stored.get("requirements") or "",
        python=stored.get("python"),
        isolated=bool(stored.get("isolated")),
        packages=list(stored.get("packages") or []),
    )


def job_out(view: JobView) -> JobOut:
    """A job in full, from services.views.job_view."""
    job = view.job
    summary = job_summary(job, view.attempt_count, view.progress)
    options = job.options
    newest = view.attempts[-1] if view.attempts else None
    return JobOut(
        **summary.model_dump(),
        command=list(job.command),
        bundle_digest=job.bundle_digest,
        env_names=sorted(job.env),
        communication=CommunicationOptions(**_finite_values(options.get("communication", {}))),
        restart=RestartPolicy(**options.get("restart", {})),
        startup_timeout_seconds=options.get("startup_timeout_seconds"),
        max_runtime_seconds=options.get("max_runtime_seconds"),
        preflight=options.get("preflight"),
        agents=options.get("agents"),
        preemption_grace_seconds=options.get("preemption_grace_seconds"),
        environment=environment_out(job.environment),
        tasks=[task_out(t, view, failed_task_index(newest)) for t in newest.tasks] if newest else [],
        latest_stacks=view.latest_stacks,
        attempt_history=[attempt_out(a, view) for a in view.attempts],
        events=[
            JobEventOut(from_state=e.from_state, to_state=e.to_state, reason=e.reason, at=e.at)
            for e in job.events
        ],
    )


def agent_out(view: AgentView) -> AgentOut:
    """An agent with its devices, usage, liveness and tasks, from services.views.agents_view."""
    agent = view.agent
    return AgentOut(
        id=agent.id,
        name=agent.name,
        hostname=agent.hostname,
        address=agent.advertise_address,
        port_range=f"{agent.port_low}-{agent.port_high}",
        version=agent.version,
        task_isolation=agent.task_isolation,
        online=view.online,
        state=view.state,
        stopped_at=agent.stopped_at,
        lost_at=agent.lost_at,
        last_heartbeat_at=agent.last_heartbeat_at,
        devices=[DeviceOut(**d) for d in agent.devices],
        memory_bytes=agent.memory_bytes or None,
        devices_used=view.devices_used,
        devices_free=view.devices_free,
        warm_pool=WarmPoolOut(
            size=agent.warm_pool_size, ready=agent.warm_pool_ready, memory_bytes=agent.warm_pool_bytes
        )
        if agent.warm_pool_size
        else None,
        tasks=[
            AgentTaskOut(
                job_id=t.job_id,
                job_name=view.job_names.get(t.job_id, ""),
                task_index=t.index,
                attempt=t.attempt_number,
                state=t.state,
                device_indices=list(t.device_indices),
                device_uuids=view.device_uuids(t),
            )
            for t in view.tasks
        ],
        cordoned=agent.cordoned_at is not None,
        cordoned_at=agent.cordoned_at,
        cordoned_by=agent.cordoned_by,
        cordon_reason=agent.cordon_reason,
        draining=agent.draining,
        drained=view.drained,
    )


def artifact_out(record: StoredFile) -> ArtifactOut:
    return ArtifactOut(
        path=record.path,
        size=record.size,
        sha256=record.sha256,
        attempt=record.attempt,
        created_at=record.created_at,
    )


def token_out(token: Token) -> TokenOut:
    return TokenOut(
        id=token.id,
        kind=token.kind,
        name=token.name,
        user=token.user,
        role=token.role,
        created_by=token.created_by,
        created_at=token.created_at,
        expires_at=token.expires_at,
        revoked_at=token.revoked_at,
    )


def log_line_out(line: LogEntry) -> LogLineOut:
    return LogLineOut(
        id=line.id,
        task=line.task,
        attempt=line.attempt,
        seq=line.seq,
        stream=line.stream,
        text=line.text,
        at=line.at,
        redraw=line.redraw,
    )
