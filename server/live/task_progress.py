"""When each task last made progress (a log line or metric point stored for it), kept in memory.

The telemetry writer (server/live/ingest.py) marks the tasks of every committed batch; the hang detector
(server/live/hang_detector.py) reads it. Nothing is written to the database: after a coordinator restart
every task's clock starts again from the restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from server.db.models import utcnow


class TaskProgress:
    """Last progress time per task id; used from the event loop only."""

    def __init__(self) -> None:
        self._last: dict[str, datetime] = {}

    def seen(self, task_ids: Iterable[str], at: datetime | None = None) -> None:
        at = at or utcnow()
        for task_id in task_ids:
            self._last[task_id] = at

    def last(self, task_id: str) -> datetime | None:
        return self._last.get(task_id)

    def retain(self, task_ids: Iterable[str]) -> None:
        """Forgets every task but these (the ones still watched), so the map never outgrows them."""
        keep = set(task_ids)
        for task_id in [t for t in self._last if t not in keep]:
            del self._last[task_id]

    def __len__(self) -> int:
        return len(self._last)
