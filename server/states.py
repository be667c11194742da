"""Job, attempt and task states and the tables of allowed transitions between them."""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    # Preempted (a higher-priority job, a team reclaiming its quota, a drain): its workers got SIGTERM
    # and are saving; once all have exited it waits again, in its original place, without using a restart.
    PREEMPTING = "PREEMPTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES


TERMINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

JOB_TRANSITIONS: dict[JobState | None, frozenset[JobState]] = {
    None: frozenset({JobState.PENDING}),
    JobState.PENDING: frozenset({JobState.SCHEDULED, JobState.FAILED, JobState.CANCELLED}),
    # SCHEDULED -> PENDING: an agent could not bind its port or fetch the bundle; place again.
    JobState.SCHEDULED: frozenset(
        {
            JobState.RUNNING,
            JobState.PENDING,
            JobState.RESTARTING,
            JobState.PREEMPTING,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RESTARTING, JobState.PREEMPTING}
    ),
    JobState.PREEMPTING: frozenset({JobState.PENDING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RESTARTING: frozenset({JobState.PENDING, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class AttemptState(str, Enum):
    ACTIVE = "ACTIVE"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # Never started: an agent refused its assignment, so the job is placed again without a restart.
    REPLACED = "REPLACED"
    # Stopped to make room (preemption or drain); the job waits for its next attempt, no restart used.
    PREEMPTED = "PREEMPTED"

    @property
    def terminal(self) -> bool:
        return self != AttemptState.ACTIVE


# An attempt is born ACTIVE (placed) and ends exactly once; a new try is a new attempt.
ATTEMPT_TRANSITIONS: dict[AttemptState | None, frozenset[AttemptState]] = {
    None: frozenset({AttemptState.ACTIVE}),
    AttemptState.ACTIVE: frozenset(
        {
            AttemptState.SUCCEEDED,
            AttemptState.FAILED,
            AttemptState.CANCELLED,
            AttemptState.REPLACED,
            AttemptState.PREEMPTED,
        }
    ),
    AttemptState.SUCCEEDED: frozenset(),
    AttemptState.FAILED: frozenset(),
    AttemptState.CANCELLED: frozenset(),
    AttemptState.REPLACED: frozenset(),
    AttemptState.PREEMPTED: frozenset(),
}


class TaskState(str, Enum):
    ASSIGNED = "ASSIGNED"  # placed; the start command is on its way to the agent
    STARTING = "STARTING"  # the agent accepted it and is fetching the bundle / spawning
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # stopped on request
    REJECTED = "REJECTED"  # the agent could not start it (port busy, bundle, spawn)
    LOST = "LOST"  # its agent went away, or no longer knows the task

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_TASK_STATES


TERMINAL_TASK_STATES = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.REJECTED, TaskState.LOST}
)
_ENDINGS = frozenset(TERMINAL_TASK_STATES)
# Tasks that hold their devices: not ended, or LOST until their agent confirms they ended.
DEVICE_HOLDING_TASK_STATES = [s.value for s in TaskState if s not in TERMINAL_TASK_STATES] + [
    TaskState.LOST.value
]

TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.ASSIGNED: frozenset({TaskState.STARTING, TaskState.RUNNING} | _ENDINGS),
    TaskState.STARTING: frozenset({TaskState.RUNNING} | _ENDINGS),
    TaskState.RUNNING: frozenset(_ENDINGS - {TaskState.REJECTED}),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.STOPPED: frozenset(),
    TaskState.REJECTED: frozenset(),
    # A LOST task whose agent comes back and reports its real ending gets that ending recorded.
    TaskState.LOST: frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED}),
}


class InvalidTransition(Exception):
    """A state change that the transition table does not allow."""

    def __init__(self, kind: str, current: str | None, requested: str) -> None:
        super().__init__(f"{kind} cannot go from {current} to {requested}")
        self.current = current
        self.requested = requested


def check_job_transition(current: JobState | None, requested: JobState) -> None:
    """Raises InvalidTransition unless the job may go from `current` to `requested`."""
    if requested not in JOB_TRANSITIONS[current]:
        raise InvalidTransition("job", current.value if current else None, requested.value)


def check_attempt_transition(current: AttemptState | None, requested: AttemptState) -> None:
    """Raises InvalidTransition unless the attempt may go from `current` to `requested`."""
    if requested not in ATTEMPT_TRANSITIONS[current]:
        raise InvalidTransition("attempt", current.value if current else None, requested.value)


def check_task_transition(current: TaskState, requested: TaskState) -> None:
    """Raises InvalidTransition unless the task may go from `current` to `requested`."""
    if requested not in TASK_TRANSITIONS[current]:
        raise InvalidTransition("task", current.value, requested.value)
