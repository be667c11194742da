"""Following a job until it ends: polls its state and the chief's new log lines once a second."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mwms.cli.client import ApiClient, ApiError

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
CHIEF_TASK = 0
# How long the coordinator may stay unreachable while we follow a job before we give up.
UNREACHABLE_GRACE_S = 30.0


def watch_job(
    client: ApiClient,
    job_id: str,
    *,
    on_job: Callable[[dict[str, Any]], None],
    on_log_lines: Callable[[list[dict[str, Any]]], None] | None = None,
    interval: float = 1.0,
    log_task: int | None = CHIEF_TASK,
) -> dict[str, Any]:
    """Calls `on_job` with each polled job (and `on_log_lines` with new lines) until it ends; returns it."""
    after: int | None = None
    unreachable_since: float | None = None
    while True:
        started = time.monotonic()
        try:
            job = client.get_job(job_id)
            if on_log_lines is not None:
                after = _deliver_new_lines(client, job_id, log_task, after, on_log_lines)
            unreachable_since = None
        except ApiError as error:
            if not error.unreachable:
                raise
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > UNREACHABLE_GRACE_S:
                raise
            time.sleep(interval)
            continue
        on_job(job)
        if job.get("state") in TERMINAL_STATES:
            if on_log_lines is not None:
                # Lines written just before the end may land after the state change: take a last look.
                _deliver_new_lines(client, job_id, log_task, after, on_log_lines)
            return job
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


def _deliver_new_lines(
    client: ApiClient,
    job_id: str,
    task: int | None,
    after: int | None,
    on_log_lines: Callable[[list[dict[str, Any]]], None],
) -> int | None:
    """Fetches every line past `after` (page by page) and returns the new cursor."""
    while True:
        page = client.logs(job_id, task=task, after=after)
        lines = page.get("lines") or []
        if lines:
            on_log_lines(lines)
        next_after = page.get("next_after", after)
        if not lines or next_after == after:
            return next_after
        after = next_after


def tail_of_task_logs(
    client: ApiClient, job_id: str, task: int, attempt: int | None, count: int
) -> list[str]:
    """The last `count` lines of one task's log (of `attempt`, or of whatever the API picks)."""
    page = client.logs(job_id, task=task, attempt=attempt, tail=count)
    return [line.get("text", "").rstrip("\n") for line in page.get("lines") or []]


def first_failed_task(job: dict[str, Any]) -> dict[str, Any] | None:
    """The task that most likely caused the job to end badly: a failed one, else any non-successful one."""
    tasks = sorted(job.get("tasks") or [], key=lambda task: task.get("index", 0))
    for wanted in ({"FAILED"}, {"LOST", "REJECTED"}, {"STOPPED"}):
        for task in tasks:
            if task.get("state") in wanted:
                return task
    return tasks[0] if tasks else None
