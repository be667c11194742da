"""What a scheduler plan is made of (server/services/scheduler/queue_plan.py): the running jobs it may
preempt, the placements it makes and the preemptions it decides. Plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from mwms.server.services.scheduler.placement import TaskPlacement
from mwms.server.services.scheduler.queue_order import WaitingJob


@dataclass(frozen=True)
class RunningJob:
    """A placed job whose tasks hold devices."""

    job_id: str
    priority: int
    team: str
    kind: str
    devices: Mapping[str, tuple[int, ...]]  # agent_id -> device indices its tasks hold
    started_at: datetime
    ends_at: datetime | None  # None: no max_runtime, never ends as far as planning knows
    borrowed: bool = False
    # May be preempted now: preemptible, RUNNING, past the minimum run time, under the hourly cap.
    preemptable: bool = False
    grace_s: int = 30
    memory: Mapping[str, int] = field(default_factory=dict)  # agent_id -> memory_per_worker its tasks hold

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.devices.values())


@dataclass(frozen=True)
class Placement:
    job: WaitingJob
    tasks: list[TaskPlacement]
    borrowed: bool


@dataclass(frozen=True)
class PreemptionDecision:
    preemptor: WaitingJob
    victims: list[RunningJob]
    cause: str  # "priority" or "reclaim"
    hold: dict[str, tuple[int, ...]]
    hold_s: int  # how long the hold lasts: the victims' longest grace plus a margin
