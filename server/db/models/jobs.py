"""SQLAlchemy models (server/db/models/): jobs, their attempts and tasks, and the events of jobs and attempts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from mwms.server.db.models import Base, new_id, utcnow


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # The jobs list pages newest first (created_at, id), filtered by state or not: with these the page
        # and its total are read from an index, never by sorting the table.
        Index("ix_jobs_created_id", "created_at", "id"),
        Index("ix_jobs_state_created_id", "state", "created_at", "id"),
        # Retention walks finished jobs oldest first.
        Index("ix_jobs_finished_id", "finished_at", "id"),
        # Every scheduler pass counts the waiting jobs and sums their priorities (the waiting-jobs cache's
        # check), and reads the live holds: both from this index, not 10,000 rows of the table.
        Index("ix_jobs_state_hold_priority", "state", "hold_until", "priority"),
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
