"""SQLAlchemy models: the coordinator's whole durable state.

This package holds what every model is built on (Base, UTCDateTime, utcnow, new_id) and re-exports each
model from its module by resource (agents, tokens, jobs, scheduling, telemetry, files, teams), so
`from mwms.server.db.models import Job` works as it always has."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, TypeDecorator
from sqlalchemy.orm import DeclarativeBase


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


# The models, by resource; imported after Base, which each of them needs.
from mwms.server.db.models.agents import Agent as Agent  # noqa: E402
from mwms.server.db.models.agents import Replica as Replica  # noqa: E402
from mwms.server.db.models.files import Bundle as Bundle  # noqa: E402
from mwms.server.db.models.files import SharedFile as SharedFile  # noqa: E402
from mwms.server.db.models.files import SharedFileChunk as SharedFileChunk  # noqa: E402
from mwms.server.db.models.files import StoredFile as StoredFile  # noqa: E402
from mwms.server.db.models.jobs import Attempt as Attempt  # noqa: E402
from mwms.server.db.models.jobs import AttemptEvent as AttemptEvent  # noqa: E402
from mwms.server.db.models.jobs import Job as Job  # noqa: E402
from mwms.server.db.models.jobs import JobEvent as JobEvent  # noqa: E402
from mwms.server.db.models.jobs import Task as Task  # noqa: E402
from mwms.server.db.models.scheduling import DeviceClaim as DeviceClaim  # noqa: E402
from mwms.server.db.models.scheduling import Preemption as Preemption  # noqa: E402
from mwms.server.db.models.teams import TeamMember as TeamMember  # noqa: E402
from mwms.server.db.models.teams import TeamQuota as TeamQuota  # noqa: E402
from mwms.server.db.models.teams import TeamUsage as TeamUsage  # noqa: E402
from mwms.server.db.models.teams import UsageClock as UsageClock  # noqa: E402
from mwms.server.db.models.telemetry import DeviceSample as DeviceSample  # noqa: E402
from mwms.server.db.models.telemetry import LogLine as LogLine  # noqa: E402
from mwms.server.db.models.telemetry import MetricPoint as MetricPoint  # noqa: E402
from mwms.server.db.models.telemetry import PreflightResult as PreflightResult  # noqa: E402
from mwms.server.db.models.telemetry import StackDump as StackDump  # noqa: E402
from mwms.server.db.models.telemetry import StackRequest as StackRequest  # noqa: E402
from mwms.server.db.models.tokens import Token as Token  # noqa: E402
