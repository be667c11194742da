"""A job's restart policy and what it makes of a failure: the job's stored restart options, with
schemas.RestartPolicy's defaults (restart_policy_value); which exit codes are retried; which mean the command
never started, so that no restart can help; and the backoff before a restart.

server/services/job_life/lifecycle.py and attempt_failures.py decide with these.
"""

from __future__ import annotations

from typing import Any

from mwms.server.db.models import Job, Task
from mwms.server.schemas import RestartOn, RestartPolicy
from mwms.server.states import TaskState
from mwms.task_environment import (
    COMMAND_NOT_EXECUTABLE_EXIT_CODE,
    COMMAND_NOT_FOUND_EXIT_CODE,
    ENVIRONMENT_NOT_BUILT_EXIT_CODE,
)

_DEFAULT_POLICY = RestartPolicy()


def restart_policy_value(job: Job, name: str) -> Any:
    """The job's stored restart option `name`, or RestartPolicy's default for it.

    Read field by field, not validated, so a damaged row behaves as it always did.
    """
    default = getattr(_DEFAULT_POLICY, name)
    return job.options.get("restart", {}).get(
        name, default.value if isinstance(default, RestartOn) else default
    )


def fail_on_nan_names(job: Job) -> list[str]:
    """Metric names whose NaN value fails the job at once (restart.fail_on_nan)."""
    names = restart_policy_value(job, "fail_on_nan") or []
    if isinstance(names, str):
        return [names]
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def is_retryable(exit_code: int | None, lost: bool, restart_on: str) -> bool:
    """Lost agents and exit codes >= 128 (signals, OOM kills) are retryable; 1-127 only with restart_on=any."""
    if lost or exit_code is None:
        return True
    if restart_on == RestartOn.ANY.value:
        return exit_code != 0
    return exit_code >= 128 or exit_code < 0


NEVER_STARTED_EXIT_CODES = frozenset(
    {COMMAND_NOT_FOUND_EXIT_CODE, COMMAND_NOT_EXECUTABLE_EXIT_CODE, ENVIRONMENT_NOT_BUILT_EXIT_CODE}
)
NEVER_STARTED_NOT_RETRIED = (
    " (not retried: the command cannot be executed, so no restart or other agent can help; fix the "
    "command and submit again)"
)
ENVIRONMENT_NOT_RETRIED = (
    " (not retried: the job's Python environment cannot be built, so no restart or other agent can help; "
    "fix its requirements and submit again)"
)


def never_started(task: Task) -> bool:
    """The agent could not execute the task's command or build its environment (FAILED, no process, exit
    code 125, 126 or 127)."""
    return (
        task.state == TaskState.FAILED.value
        and task.pid is None
        and task.exit_code in NEVER_STARTED_EXIT_CODES
    )


def restart_backoff(base_s: float, restarts_done: int) -> float:
    """Seconds to wait before restart number `restarts_done + 1`: doubling, capped at 60 s."""
    return min(60.0, base_s * (2**restarts_done))
