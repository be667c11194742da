"""SQLAlchemy models (server/db/models/): what the scheduler holds in the database: device claims and preemptions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from mwms.server.db.models import Base, utcnow


class DeviceClaim(Base):
    """A device of an agent held by a task, from its placement until it no longer holds devices: the
    database's own guard that a device is never given twice, whatever a replica's plan read."""

    __tablename__ = "device_claims"

    agent_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    device_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)


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
