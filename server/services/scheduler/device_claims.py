"""Device claims: the database's guard that a device is never given to two live tasks.

Placement claims every device a task gets (one row per agent and device index, primary key both) in the
transaction that creates the task; the claim goes when the task stops holding devices (transition_task),
or with the task's row. A plan made on a stale read, on whichever replica, that would give a held device
again fails on the primary key, and that placement alone is dropped (server/services/scheduler/plan_apply.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mwms.server.db.models import DeviceClaim, Task
from mwms.server.states import DEVICE_HOLDING_TASK_STATES


def claim(session: Session, claims: Sequence[tuple[str, int, str]]) -> None:
    """Claims devices, as (agent id, device index, task id); raises IntegrityError when one is held.

    A claim whose task no longer holds devices (a state written without transition_task) is dropped
    first, so a missed release can never keep a device from being given again."""
    if not claims:
        return
    agents = {agent_id for agent_id, _, _ in claims}
    ended = select(Task.id).where(Task.agent_id.in_(agents), Task.state.not_in(DEVICE_HOLDING_TASK_STATES))
    session.execute(
        delete(DeviceClaim).where(DeviceClaim.agent_id.in_(agents), DeviceClaim.task_id.in_(ended))
    )
    session.execute(
        insert(DeviceClaim),
        [{"agent_id": a, "device_index": i, "task_id": t} for a, i, t in claims],
    )


def release(session: Session, task: Task) -> None:
    """The task no longer holds its devices."""
    session.execute(delete(DeviceClaim).where(DeviceClaim.task_id == task.id))


def is_conflict(error: IntegrityError) -> bool:
    """Whether `error` is a device claimed twice (not some other constraint)."""
    text = str(error.orig).lower()
    return "device_claims" in text
