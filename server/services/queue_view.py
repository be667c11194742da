"""The queue as the scheduler sees it: every waiting job in placement order, with why it waits.

Read by `GET /api/v1/queue`, `mwms queue` and the dashboard's queue view. The order and the reasons
come from the same planner the scheduler runs (server/services/queue_plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class QueueRow:
    """One waiting job: its 1-based position in the order and the typed reason it waits."""

    position: int
    job_id: str
    name: str
    state: str  # PENDING, RESTARTING or PREEMPTING
    team: str
    submitted_by: str
    priority: int
    workers: int
    gpus_per_worker: int
    preemptible: bool
    created_at: datetime
    # {"kind": ..., "message": "...", "estimated_start": iso or None, ...details} (wait_reasons.py)
    waiting: dict[str, Any]
