"""SQLAlchemy models: the coordinator's whole durable state."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    """Current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def new_id() -> str:
    """A short random id, easy to type on a command line."""
    return uuid.uuid4().hex[:12]


class UTCDateTime(TypeDecorator[datetime]):
    """DateTime stored as UTC that always comes back timezone-aware (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class Agent(Base):
    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    hostname: Mapped[str] = mapped_column(String(255))
    advertise_address: Mapped[str] = mapped_column(String(255))
    port_low: Mapped[int] = mapped_column(Integer)
    port_high: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(50), default="")
    # How the agent confines its tasks, as it says at registration (RegisterRequest.task_isolation).
    task_isolation: Mapped[str] = mapped_column(String(200), default="", server_default="")
    # [{"kind": "gpu"|"cpu", "index": int, "name": str, "uuid": str, "memory_mib": int}]
    devices: Mapped[list[Any]] = mapped_column(default=list)
    # Memory the agent offers its tasks in all (RegisterRequest.memory_bytes); 0: unknown (no memory check).
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    # Liveness as data: the agent is online while now < online_until.
    online_until: Mapped[datetime | None] = mapped_column(default=None)
    # Set when the reconciler has acted on this agent being lost; cleared when it comes back.
    lost_at: Mapped[datetime | None] = mapped_column(default=None)
    # Set when the agent said goodbye (a clean stop, e.g. `systemctl stop`): it reads as stopped, not online
    # and never lost; cleared when it registers, says hello or is heard from on a later stream.
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
    # sha256 (hex) of the secret half of the credential issued at registration; None: none issued.
    credential_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    # Set when an admin removed the agent: its credential is void until it joins again with a join token.
    removed_at: Mapped[datetime | None] = mapped_column(default=None)
    # Cordoned: no new placements (an admin's `mwms agent cordon`, or a drain); who, when and why.
    cordoned_at: Mapped[datetime | None] = mapped_column(default=None)
    cordoned_by: Mapped[str] = mapped_column(String(200), default="", server_default="")
    cordon_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    # Draining: cordoned, and the jobs it runs are preempted gracefully and placed elsewhere.
    draining: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The coordinator replica holding the agent's stream, and the stream's epoch (one more at every hello):
    # commands are delivered only by that replica on that stream (server/services/fleet/replicas.py).
    stream_replica: Mapped[str | None] = mapped_column(String(32), default=None)
    stream_epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Token(Base):
    """A bearer secret, stored only as its sha256: an API token, a dashboard session or an agent join token.

    API tokens belong to a user and carry a role. A dashboard session is derived from the API token that
    logged in (parent_id) and dies with it. Join tokens admit new agents.
    """

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    kind: Mapped[str] = mapped_column(String(10))  # "api", "session" or "join"
    name: Mapped[str] = mapped_column(String(200), default="")
    user: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[str] = mapped_column(String(10), default="")  # "admin", "user", "viewer"; "" for join
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    parent_id: Mapped[str | None] = mapped_column(
        ForeignKey("tokens.id", ondelete="CASCADE"), default=None, index=True
    )
    created_by: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Bundle(Base):
    __tablename__ = "bundles"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    archive_format: Mapped[str] = mapped_column(String(10))  # "tar.gz" or "zip"
    filename: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # The jobs list pages newest first (created_at, id), filtered by state or not: with these the page
        # and its total are read from an index, never by sorting the table.
        Index("ix_jobs_created_id", "created_at", "id"),
        Index("ix_jobs_state_created_id", "state", "created_at", "id"),
        # Retention walks finished jobs oldest first.
        Index("ix_jobs_finished_id", "finished_at", "id"),
        UniqueConstraint("submitted_by", "idempotency_key", name="uq_jobs_submitter_idempotency_key"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str] = mapped_column(Text, default="")
    bundle_digest: Mapped[str] = mapped_column(ForeignKey("bundles.digest"))
    command: Mapped[list[Any]] = mapped_column()
    env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    num_workers: Mapped[int] = mapped_column(Integer)
    gpus_per_worker: Mapped[int] = mapped_column(Integer, default=0)
    # Bytes of memory each worker may use (its tasks' limit; placement counts it against agents' memory_bytes)
    # and the CPUs each may use at most; None: not asked.
    memory_per_worker: Mapped[int | None] = mapped_column(BigInteger, default=None, nullable=True)
    cpus_per_worker: Mapped[float | None] = mapped_column(Float, default=None, nullable=True)
    # Everything else the user asked for: communication options, restart policy, timeouts.
    options: Mapped[dict[str, Any]] = mapped_column(default=dict)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    # When a RESTARTING job may be placed again.
    not_before: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # The user (token owner) who submitted the job, and who cancelled it, if anyone did.
    submitted_by: Mapped[str] = mapped_column(String(200), default="")
    cancelled_by: Mapped[str] = mapped_column(String(200), default="")
    # A client-generated key that makes a retried submit return the job the first one created.
    idempotency_key: Mapped[str | None] = mapped_column(String(100), default=None)
    # Sharing (server/services/scheduler/queue_order.py): the job's priority band (0-1000), its submitter's team
    # then, and whether the scheduler may preempt it.
    priority: Mapped[int] = mapped_column(Integer, default=500, server_default="500")
    team: Mapped[str] = mapped_column(String(200), default="", server_default="")
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    # Capacity held for this job while the jobs it preempted exit: {agent_id: [device index, ...]},
    # nobody else is placed there until `hold_until` (server/services/preemption.py).
    hold: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None, nullable=True)
    hold_until: Mapped[datetime | None] = mapped_column(default=None)
    # Why a waiting job waits, typed (server/services/scheduler/wait_reasons.py); {} once it is placed.
    waiting: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    # The job's own Python environment (schemas.EnvironmentIn: requirements, python, locked, packages);
    # None: its tasks run in their agents' environment.
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None, nullable=True)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.number", cascade="all, delete-orphan"
    )
    events: Mapped[list[JobEvent]] = relationship(order_by="JobEvent.id", cascade="all, delete-orphan")


class JobEvent(Base):
    """One recorded state change of a job."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str | None] = mapped_column(String(20))
    to_state: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime] = mapped_column(default=utcnow)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "number"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(20))  # mwms.server.states.AttemptState
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    # Placed over its team's quota on idle capacity: reclaimed first when a team within quota needs it.
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    job: Mapped[Job] = relationship(back_populates="attempts")
    tasks: Mapped[list[Task]] = relationship(order_by="Task.index", cascade="all, delete-orphan")
    events: Mapped[list[AttemptEvent]] = relationship(
        order_by="AttemptEvent.id", cascade="all, delete-orphan", passive_deletes=True
    )


class AttemptEvent(Base):
    """One recorded state change of an attempt (its birth as ACTIVE included)."""

    __tablename__ = "attempt_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), index=True)
    from_state: Mapped[str | None] = mapped_column(String(20))
    to_state: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime] = mapped_column(default=utcnow)
    # An ending's kind and what acted on it (mwms.server.services.job_life.attempt_endings); "" and {} otherwise.
    cause: Mapped[str] = mapped_column(String(30), default="", server_default="")
    details: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("attempt_id", "index"),
        Index("ix_tasks_agent_state", "agent_id", "state"),
        # Tasks that still hold devices (agents, overview) are few among the tasks of finished jobs.
        Index("ix_tasks_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    attempt_number: Mapped[int] = mapped_column(Integer)
    index: Mapped[int] = mapped_column(Integer)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"))
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    device_kind: Mapped[str] = mapped_column(String(10))  # "gpu" or "cpu"
    device_indices: Mapped[list[Any]] = mapped_column(default=list)
    tf_config: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(20))
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    pid: Mapped[int | None] = mapped_column(Integer, default=None)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    stop_reason: Mapped[str] = mapped_column(Text, default="")
    # SIGTERM-to-SIGKILL grace for this stop when it is not the coordinator's default (a preemption's).
    stop_grace_s: Mapped[int | None] = mapped_column(Integer, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    # When a log line or metric point of the task was last stored, as the replicas flush it (seconds
    # late at most): hang detection reads it, whichever replica stored the task's telemetry.
    progress_at: Mapped[datetime | None] = mapped_column(default=None)
    # The job's own environment on this task's agent: "" (none, or not reported), "building", "ready";
    # the start-up timeout counts from when the last task's was ready, not during a build.
    environment: Mapped[str] = mapped_column(String(10), default="", server_default="")
    environment_ready_at: Mapped[datetime | None] = mapped_column(default=None)
    environment_build_s: Mapped[float | None] = mapped_column(Float, default=None, nullable=True)
    # What the agent's build holds, hashed, and the Python and platform it is for: a gang runs only when
    # every worker's digest agrees.
    environment_digest: Mapped[str] = mapped_column(String(64), default="", server_default="")
    environment_platform: Mapped[str] = mapped_column(String(100), default="", server_default="")
    # What its agent reports of its memory: the most its cgroup has held so far, and the limit it applied;
    # None: not reported.
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None, nullable=True)
    memory_limit_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None, nullable=True)


class DeviceClaim(Base):
    """A device of an agent held by a task, from its placement until it no longer holds devices: the
    database's own guard that a device is never given twice, whatever a replica's plan read."""

    __tablename__ = "device_claims"

    agent_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    device_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)


class LogLine(Base):
    __tablename__ = "log_lines"
    __table_args__ = (UniqueConstraint("task_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(10))
    text: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column()
    # The seq of the line of the same task this one is a newer state of (a `\r` redraw), NULL when none.
    replaces_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # A newer state of this line was stored: tails and failure reasons leave it out.
    superseded: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class MetricPoint(Base):
    __tablename__ = "metric_points"
    __table_args__ = (
        UniqueConstraint("task_id", "seq"),
        Index("ix_metric_points_job_name_step", "job_id", "name", "step"),
        # A job's newest attempt and its latest step and loss (the jobs list) are one index seek each.
        Index("ix_metric_points_job_attempt_step", "job_id", "attempt", "step"),
        # The points stored after a cursor (a page polling for what is new) are one index seek.
        Index("ix_metric_points_job_id_id", "job_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    step: Mapped[int] = mapped_column(Integer)
    # NaN is stored as NULL (SQLite turns NaN into NULL anyway); +-Infinity are stored as they are.
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    wall_time: Mapped[datetime] = mapped_column()


class StoredFile(Base):
    """A file the coordinator keeps for a job: an artifact from the chief, or a checkpoint archive."""

    __tablename__ = "stored_files"
    __table_args__ = (UniqueConstraint("job_id", "kind", "attempt", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(20))  # "artifact" or "checkpoint"
    attempt: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(1000))
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StackRequest(Base):
    """One collection of the Python stacks of every task of an attempt, on demand or by hang detection."""

    __tablename__ = "stack_requests"
    __table_args__ = (Index("ix_stack_requests_job_requested", "job_id", "requested_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    cause: Mapped[str] = mapped_column(String(20))  # "request" or "hang"
    requested_by: Mapped[str] = mapped_column(String(200), default="")
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)

    dumps: Mapped[list[StackDump]] = relationship(
        order_by="StackDump.task_index", cascade="all, delete-orphan"
    )


class StackDump(Base):
    """The stacks of one task for one StackRequest, as its agent sent them."""

    __tablename__ = "stack_dumps"
    __table_args__ = (UniqueConstraint("request_id", "task_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("stack_requests.id", ondelete="CASCADE"))
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    task_index: Mapped[int] = mapped_column(Integer)
    agent_id: Mapped[str] = mapped_column(String(32))
    pid: Mapped[int | None] = mapped_column(Integer, default=None)
    method: Mapped[str] = mapped_column(String(20), default="")  # "py-spy" or "faulthandler"
    text: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str] = mapped_column(Text, default="")
    # Whether some thread waits inside a TensorFlow collective; None: could not tell (no dump).
    in_collective: Mapped[bool | None] = mapped_column(Boolean, default=None)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)


class PreflightResult(Base):
    """What one task's preflight check found before the user's program ran."""

    __tablename__ = "preflight_results"
    __table_args__ = (
        UniqueConstraint("task_id"),
        Index("ix_preflight_results_job_attempt", "job_id", "attempt"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    task_index: Mapped[int] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean)
    message: Mapped[str] = mapped_column(Text, default="")
    report: Mapped[dict[str, Any]] = mapped_column(default=dict)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class DeviceSample(Base):
    """One sample of one device of an agent: utilisation, memory and temperature (GPUs, through NVML)."""

    __tablename__ = "device_samples"
    __table_args__ = (Index("ix_device_samples_agent_at", "agent_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    device_index: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column()
    utilization_pct: Mapped[float] = mapped_column(Float)
    memory_used_mib: Mapped[int] = mapped_column(Integer)
    memory_total_mib: Mapped[int] = mapped_column(Integer)
    temperature_c: Mapped[float] = mapped_column(Float)


class Preemption(Base):
    """One preemption of a job's attempt: for which job (or a drain), why, and how its tasks ended."""

    __tablename__ = "preemptions"
    __table_args__ = (Index("ix_preemptions_victim_at", "victim_job_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    victim_job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), unique=True)
    # The job it made room for; None for a drain.
    preemptor_job_id: Mapped[str | None] = mapped_column(String(32), default=None)
    cause: Mapped[str] = mapped_column(String(20))  # mwms.server.services.preemption.CAUSES
    at: Mapped[datetime] = mapped_column(default=utcnow)
    # Set when every task has ended: True when all exited PREEMPTED_AND_SAVED_EXIT_CODE.
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    saved: Mapped[bool | None] = mapped_column(Boolean, default=None)


class TeamMember(Base):
    """A user's team (admin-managed); a user with none is a team of their own, named after them."""

    __tablename__ = "team_members"

    user: Mapped[str] = mapped_column(String(200), primary_key=True)
    team: Mapped[str] = mapped_column(String(200), index=True)
    added_by: Mapped[str] = mapped_column(String(200), default="")
    added_at: Mapped[datetime] = mapped_column(default=utcnow)


class TeamQuota(Base):
    """A team's quota of GPUs and of CPU slots; None: no limit of that kind."""

    __tablename__ = "team_quotas"

    team: Mapped[str] = mapped_column(String(200), primary_key=True)
    gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    cpu_slots: Mapped[int | None] = mapped_column(Integer, default=None)
    set_by: Mapped[str] = mapped_column(String(200), default="")
    set_at: Mapped[datetime] = mapped_column(default=utcnow)


class TeamUsage(Base):
    """A team's use of one device kind ("gpu", "cpu") in device-seconds, decayed with the fair-share half-life,
    as of `as_of` (server/services/scheduler/fair_share.py): written only while the team holds devices of that kind."""

    __tablename__ = "team_usage"

    team: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(10), primary_key=True)
    device_seconds: Mapped[float] = mapped_column(Float)
    as_of: Mapped[datetime] = mapped_column()


class UsageClock(Base):
    """One row (id 1): the moment team usage is counted up to, and the half-life it decays with."""

    __tablename__ = "usage_clock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    accrued_to: Mapped[datetime] = mapped_column()
    half_life_s: Mapped[float] = mapped_column(Float)


class Replica(Base):
    """One coordinator process on this database: where it listens, what it serves, when it was last seen."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(255))  # host:http port, or --replica-name
    http_address: Mapped[str] = mapped_column(String(300), default="")
    grpc_address: Mapped[str] = mapped_column(String(300), default="")
    version: Mapped[str] = mapped_column(String(50), default="")
    serve: Mapped[str] = mapped_column(String(10))  # "api", "agents" or "both"
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Written every beat (about a second); a replica not seen for REPLICA_TIMEOUT_S is gone.
    seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
    agents_held: Mapped[int] = mapped_column(Integer, default=0)
    # The background loops this replica leads (server/live/pass_locks.py).
    loops: Mapped[list[Any]] = mapped_column(default=list)


class SharedFile(Base):
    """A file of the data dir (a bundle, a checkpoint, an artifact) kept in the database too, so that every
    replica can serve it (server/services/storage/shared_files.py); on SQLite the data dir alone holds it."""

    __tablename__ = "shared_files"

    # Relative to the data dir, e.g. "bundles/<digest>", "files/<job>/checkpoint.tar.gz".
    path: Mapped[str] = mapped_column(String(1200), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    chunks: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SharedFileChunk(Base):
    """One piece (at most 1 MiB) of a shared file's content, in order."""

    __tablename__ = "shared_file_chunks"

    path: Mapped[str] = mapped_column(String(1200), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
