"""When each task last made progress (a log line or metric point stored for it), kept in memory.

The telemetry writer (server/live/ingest.py) marks the tasks of every committed batch; the hang detector
(server/live/hang_detector.py) reads it. With replicas, each one stores the telemetry of the agents it
holds, so what changed is also flushed to `tasks.progress_at` about every second (`take_changed`, by the
loops' flush) and the hang detector, on whichever replica, reads both.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from mwms.server.db.models import utcnow


class TaskProgress:
    """Last progress time per task id; used from the event loop only."""

    def __init__(self) -> None:
        self._last: dict[str, datetime] = {}
        self._changed: dict[str, datetime] = {}  # since the last flush

    def seen(self, task_ids: Iterable[str], at: datetime | None = None) -> None:
        at = at or utcnow()
        for task_id in task_ids:
            self._last[task_id] = at
            self._changed[task_id] = at

    def take_changed(self) -> dict[str, datetime]:
        """What changed since the last take, to write; hand it back with `restore` if the write fails."""
        changed, self._changed = self._changed, {}
        return changed

    def restore(self, changed: dict[str, datetime]) -> None:
        for task_id, at in changed.items():
            if task_id not in self._changed or self._changed[task_id] < at:
                self._changed[task_id] = at

    def last(self, task_id: str) -> datetime | None:
        return self._last.get(task_id)

    def forget_before(self, cutoff: datetime) -> None:
        """Forgets progress older than `cutoff` (flushed long ago: the database has it)."""
        for task_id in [t for t, at in self._last.items() if at < cutoff]:
            del self._last[task_id]

    def retain(self, task_ids: Iterable[str]) -> None:
        """Forgets every task but these (the ones still watched), so the map never outgrows them."""
        keep = set(task_ids)
        for task_id in [t for t in self._last if t not in keep]:
            del self._last[task_id]

    def __len__(self) -> int:
        return len(self._last)
