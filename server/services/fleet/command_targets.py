"""Which agents a transaction gave commands to: new tasks to start, tasks asked to stop or marked LOST.

The coordinator pushes commands only to the agents concerned (server/live/hub.py); the writer of a
transaction learns them from the session's flushes instead of each service returning them.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.orm import Session

from mwms.server.db.models import Task
from mwms.server.states import TaskState

_COMMAND_STATES = (TaskState.ASSIGNED.value, TaskState.LOST.value)


def track_command_targets(session: Session) -> set[str]:
    """A set that fills, as `session` flushes, with the ids of agents that may have commands waiting."""
    targets: set[str] = set()

    def collect(flushed: Session, _context: Any) -> None:
        for obj in chain(flushed.new, flushed.dirty):
            if isinstance(obj, Task) and obj.agent_id and _gives_command(obj, obj in flushed.new):
                targets.add(obj.agent_id)

    event.listen(session, "after_flush", collect)
    return targets


def _gives_command(task: Task, new: bool) -> bool:
    if new:
        return True
    attrs = inspect(task).attrs
    if attrs.stop_requested.history.has_changes():
        return True
    return attrs.state.history.has_changes() and task.state in _COMMAND_STATES
