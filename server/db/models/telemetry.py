"""SQLAlchemy models (server/db/models/): what tasks and agents report: log lines, metrics, device samples, preflight results, stack dumps."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from mwms.server.db.models import Base, new_id, utcnow


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
