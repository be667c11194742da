"""Device claims: the database's guard that a device is never given to two live tasks.

Placement claims every device a task gets (one row per agent and device index, primary key both) in the
transaction that creates the task; the claim goes when the task stops holding devices (transition_task),
or with the task's row. A plan made on a stale read, on whichever replica, that would give a held device
again fails on the primary key, and that placement alone is dropped (server/services/scheduling.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server.db.models import DeviceClaim, Task


def claim(session: Session, tasks: Iterable[Task]) -> None:
    """Claims the devices of `tasks` (flushed: raises IntegrityError when one is held)."""
    session.add_all(
        DeviceClaim(agent_id=task.agent_id, device_index=int(index), task_id=task.id)
        for task in tasks
        for index in task.device_indices
    )
    session.flush()


def release(session: Session, task: Task) -> None:
    """The task no longer holds its devices."""
    session.execute(delete(DeviceClaim).where(DeviceClaim.task_id == task.id))


def is_conflict(error: IntegrityError) -> bool:
    """Whether `error` is a device claimed twice (not some other constraint)."""
    text = str(error.orig).lower()
    return "device_claims" in text
