"""SQLAlchemy models (server/db/models/): teams: their members, quotas, usage and the clock that accrues it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Float,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from mwms.server.db.models import Base, utcnow


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
