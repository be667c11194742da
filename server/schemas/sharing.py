"""Sharing a cluster (issue 18): the queue, teams and quotas, cordons and drains."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from mwms.server.schema_types import PRINTABLE_PATTERN, WHOLE_FLOATS_AS_INT, StrictBool, matching
from mwms.server.schemas.common import MAX_GRACE_SECONDS, GraceSeconds

MAX_CORDON_REASON_CHARS = 500
MAX_DRAIN_GRACE_SECONDS = MAX_GRACE_SECONDS
MAX_QUOTA_DEVICES = 1_000_000


CordonReason = Annotated[
    str,
    Field(
        max_length=MAX_CORDON_REASON_CHARS,
        json_schema_extra={"pattern": PRINTABLE_PATTERN},
        description="why, for whoever looks at `mwms agents`",
    ),
    matching(PRINTABLE_PATTERN, "printable: no newlines, control characters or emoji"),
]


class QueueEntry(BaseModel):
    """One waiting job in the scheduler's order (server/services/scheduler/queue_view.py QueueRow)."""

    position: int = Field(description="1-based place in the order the scheduler places jobs in")
    job_id: str
    name: str
    state: str = Field(description="PENDING, RESTARTING or PREEMPTING")
    team: str
    submitted_by: str
    priority: int
    workers: int
    gpus_per_worker: int
    memory_per_worker: int | None = Field(default=None, description="bytes per worker; null: none asked")
    preemptible: bool
    created_at: datetime
    waiting: dict[str, Any] = Field(
        description="why it waits: kind, message, estimated_start (ISO time or null) and the kind's details"
    )
    estimated_start: datetime | None = Field(
        default=None,
        description="when it is estimated to start, for people (server/services/scheduler/start_estimates.py): from "
        "running jobs' max_runtime, else from how long their users' jobs of the same shape usually run; "
        "null: unknown. waiting.estimated_start is the scheduler's own reservation (max_runtime only)",
    )
    estimate_basis: Literal["max_runtime", "similar_jobs", "overdue", "unknown"] = Field(
        default="unknown",
        description="what estimated_start rests on: max_runtime (every end it waits for is a max_runtime), "
        "similar_jobs (some come from the typical run time of the same user's jobs of that shape), overdue "
        "(running jobs have run past that typical time and may end any moment: it may start any time now), "
        "unknown (nothing to go on)",
    )


class QueuePage(BaseModel):
    """What `GET /api/v1/queue` answers: one page of the waiting jobs, in order."""

    jobs: list[QueueEntry]
    total: int = Field(description="waiting jobs in all")
    offset: int
    limit: int


class DeviceCounts(BaseModel):
    gpus: int | None = Field(default=None, description="GPUs; null in a quota: no cap")
    cpu_slots: int | None = Field(default=None, description="CPU slots; null in a quota: no cap")


class DeviceAmounts(BaseModel):
    gpus: float = Field(description="of GPUs")
    cpu_slots: float = Field(description="of CPU slots")


class TeamOut(BaseModel):
    """A team: its members, its quota (null: none), the devices its jobs hold now, and its fair share over time:
    within a priority band the team with the lowest standing plus dominant share now (in_use over share, the
    larger of the two kinds) goes first."""

    team: str
    members: list[str]
    quota: DeviceCounts | None
    in_use: DeviceCounts
    usage_device_hours: DeviceAmounts = Field(
        description="device-hours its jobs held, each hour decayed with MWMS_FAIR_SHARE_HALF_LIFE_HOURS "
        "(one half-life ago counts half)"
    )
    share: DeviceAmounts = Field(
        description="its share: its quota, else an even part of the online devices among the teams that run "
        "or wait (itself included)"
    )
    standing: float = Field(
        ge=0,
        description="its decayed usage over its share, in hours of its whole share (the larger of the two "
        "kinds); 0: no usage on record",
    )


QuotaCount = Annotated[int, Field(ge=0, le=MAX_QUOTA_DEVICES), Strict(), WHOLE_FLOATS_AS_INT]


class QuotaIn(BaseModel):
    """What `PUT /api/v1/teams/{team}/quota` takes; null (or leaving a kind out) sets no cap for it."""

    model_config = ConfigDict(extra="forbid")

    gpus: QuotaCount | None = None
    cpu_slots: QuotaCount | None = None


class TeamMemberOut(BaseModel):
    team: str
    user: str
    added_by: str
    added_at: datetime


class CordonIn(BaseModel):
    """What `POST /api/v1/agents/{agent}/cordon` takes."""

    model_config = ConfigDict(extra="forbid")

    reason: CordonReason = ""


class DrainIn(BaseModel):
    """What `POST /api/v1/agents/{agent}/drain` takes."""

    model_config = ConfigDict(extra="forbid")

    reason: CordonReason = ""
    grace_seconds: GraceSeconds | None = Field(
        default=None,
        description="SIGTERM-to-SIGKILL grace for the preempted jobs; default: each job's "
        "preemption_grace_seconds, else MWMS_PREEMPTION_GRACE_S; at most MWMS_MAX_PREEMPTION_GRACE_S",
    )
    let_finish: StrictBool = Field(
        default=False, description="true: preempt nothing, let the jobs it runs finish; only cordon it"
    )
