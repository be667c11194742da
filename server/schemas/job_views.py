"""A job as the API shows it: its summary and details, its tasks, attempts and their endings, its events."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from mwms.metrics_line import NonFinite
from mwms.priorities import DEFAULT_PRIORITY
from mwms.server.schemas.common import DEVICE_UUIDS_DESCRIPTION
from mwms.server.schemas.job_parts import CommunicationOptions, EnvironmentOut, RestartPolicy
from mwms.server.states import JobState


class TaskOut(BaseModel):
    id: str
    index: int
    attempt: int
    agent_id: str
    agent_name: str
    address: str
    state: str
    exit_code: int | None
    message: str
    pid: int | None = Field(description="process id on the agent's machine while it runs")
    device_kind: str
    device_indices: list[int] = Field(description="the host's indices of the devices it holds")
    device_uuids: list[str] = Field(default_factory=list, description=DEVICE_UUIDS_DESCRIPTION)
    tf_config: str
    started_at: datetime | None
    ended_at: datetime | None
    environment: str = Field(
        default="",
        description="the job's own environment on this task's agent: building, ready, or empty (none, or "
        "not reported yet)",
    )
    environment_build_seconds: float | None = Field(
        default=None, description="how long its build took on this agent; 0: found in the agent's cache"
    )
    peak_memory_bytes: int | None = Field(
        default=None,
        description="the most memory the task has held so far, as its agent measured it (its cgroup); null: "
        "not reported",
    )
    memory_limit_bytes: int | None = Field(
        default=None,
        description="the memory limit its agent applied: the job's memory_per_worker, else the agent's "
        "share for tasks; null: none reported",
    )
    ended_attempt: bool = Field(
        default=False,
        description="its own failure (or its lost agent) ended its attempt: the worker that failed; the "
        "others were stopped because of it",
    )


# A job shows this many of its newest attempts (attempt_history); `attempts` counts them all.
ATTEMPTS_SHOWN = 20


class AttemptEndingOut(BaseModel):
    """Why an attempt ended and what acted on it (server/services/job_life/attempt_endings.py lists the kinds)."""

    kind: str = Field(
        description="succeeded, preempted, reclaimed, drained, agent_lost, task_failed, hang, startup_timeout, "
        "environment_mismatch, refused, start_failed, cancelled, runtime_limit, nan_metric; unrecorded: it "
        "ended before endings were recorded"
    )
    message: str = Field(
        description="the ending in words, e.g. 'preempted by job 3f2a9c1d0b4e (priority 900)'"
    )
    job_id: str | None = Field(default=None, description="preempted, reclaimed: the job it made room for")
    priority: int | None = Field(default=None, description="preempted, reclaimed: that job's priority then")
    team: str | None = Field(default=None, description="reclaimed: the team that took its quota back")
    agent: str | None = Field(
        default=None, description="drained, agent_lost, task_failed, refused: the agent's name"
    )
    agent_id: str | None = Field(default=None, description="that agent's id")
    task: int | None = Field(
        default=None, description="agent_lost, task_failed, refused, start_failed: the task's index"
    )
    exit_code: int | None = Field(default=None, description="task_failed: the task's exit code, if any")
    by: str | None = Field(default=None, description="cancelled, drained: the user who did it, if known")
    restart: int | None = Field(default=None, description="the restart this failure led to; null: none")
    restart_cause: str | None = Field(
        default=None,
        description="that restart's cause as mwms_job_restarts_total counts it: agent_lost, signal, "
        "exit_code, hang, startup_timeout, other",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="the kind's other details: how (agent_lost: silent, stopped, removed, forgot), note, "
        "timeout_s, workers, limit_s, metric, step, max_restarts",
    )


class AttemptEventOut(BaseModel):
    from_state: str | None
    to_state: str
    reason: str
    at: datetime
    cause: str = Field(default="", description="an ending's kind (AttemptEndingOut.kind); empty otherwise")


class AttemptOut(BaseModel):
    number: int
    state: str
    reason: str
    created_at: datetime
    ended_at: datetime | None
    tasks: list[TaskOut]
    ended: AttemptEndingOut | None = Field(
        default=None, description="why it ended and what acted on it; null while it is ACTIVE"
    )
    events: list[AttemptEventOut] = Field(
        default_factory=list, description="its state changes, oldest first (placed, then how it ended)"
    )


class JobEventOut(BaseModel):
    from_state: str | None
    to_state: str
    reason: str
    at: datetime


class JobSummary(BaseModel):
    id: str
    name: str
    state: JobState
    reason: str
    workers: int
    gpus_per_worker: int
    memory_per_worker: int | None = Field(default=None, description="bytes per worker, as submitted")
    cpus_per_worker: float | None = Field(default=None, description="CPUs per worker, as submitted")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    restarts: int
    step: int | None = Field(description="latest reported step of the current attempt")
    loss: float | NonFinite | None = Field(
        description='latest reported loss: a number, or "NaN", "Infinity" or "-Infinity"'
    )
    submitted_by: str = Field(description="the user whose token submitted the job")
    team: str = Field(default="", description="the submitter's team when the job was submitted")
    priority: int = Field(default=DEFAULT_PRIORITY, description="0-1000, higher is placed first")
    preemptible: bool = True
    waiting: dict[str, Any] = Field(
        default_factory=dict,
        description="why a waiting job waits, typed: kind (over_quota, no_fit, reserved, behind_priority, "
        "cordoned, pinned, preempting, connecting) and its details, estimated_start when known; {} once placed",
    )
    cancelled_by: str = Field(description="the user who cancelled the job; empty when nobody did")


class JobOut(JobSummary):
    command: list[str]
    bundle_digest: str
    env_names: list[str]
    communication: CommunicationOptions
    restart: RestartPolicy
    startup_timeout_seconds: float | None
    max_runtime_seconds: float | None
    preflight: bool | None = Field(default=None, description="as submitted; None: the coordinator's default")
    agents: list[str] | None = Field(default=None, description="worker i runs on agents[i], when set")
    preemption_grace_seconds: int | None = Field(default=None, description="as submitted")
    environment: EnvironmentOut | None = Field(default=None, description="the job's own Python environment")
    tasks: list[TaskOut] = Field(description="tasks of the newest attempt")
    latest_stacks: str | None = Field(
        default=None,
        description="the id of the job's newest stack dump (GET /api/v1/jobs/{id}/stacks answers it); null: "
        "none taken yet, and that GET answers 404",
    )
    attempt_history: list[AttemptOut] = Field(
        description=f"the newest {ATTEMPTS_SHOWN} attempts, oldest first; `attempts` counts them all"
    )
    events: list[JobEventOut]


class JobPage(BaseModel):
    jobs: list[JobSummary]
    total: int
    offset: int
    limit: int
