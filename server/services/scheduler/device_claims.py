"""Device claims: the database's guard that a device is never given to two live tasks.

Placement claims every device a task gets (one row per agent and device index, primary key both) in the
transaction that creates the task; the claim goes when the task stops holding devices (transition_task),
or with the task's row. A plan made on a stale read, on whichever replica, that would give a held device
again fails on the primary key, and that placement alone is dropped (server/services/scheduler/plan_apply.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mwms.server.db.models import DeviceClaim, Task
from mwms.server.states import DEVICE_HOLDING_TASK_STATES


def claim(session: Session, tasks: Iterable[Task]) -> None:
    """Claims the devices of `tasks` (flushed: raises IntegrityError when one is held).

    A claim whose task no longer holds devices (a state written without transition_task) is dropped
    first, so a missed release can never keep a device from being given again."""
    tasks = list(tasks)
    agents = {task.agent_id for task in tasks}
    ended = select(Task.id).where(Task.agent_id.in_(agents), Task.state.not_in(DEVICE_HOLDING_TASK_STATES))
    session.execute(
        delete(DeviceClaim).where(DeviceClaim.agent_id.in_(agents), DeviceClaim.task_id.in_(ended))
    )
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
