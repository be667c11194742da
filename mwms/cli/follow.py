"""Following a job until it ends (`Job.wait`, polling once a second: the job's final state and every
task of its newest attempt ended), delivering the chief's new log lines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mwms.cli.safe_text import terminal_safe
from mwms.client import Client, Job
from mwms.client.job import first_failed_task, running_tasks

CHIEF_TASK = 0
__all__ = ["watch_job", "tail_of_task_logs", "first_failed_task", "CHIEF_TASK", "running_tasks"]


def watch_job(
    client: Client,
    job_id: str,
    *,
    on_job: Callable[[dict[str, Any]], None],
    on_log_lines: Callable[[list[dict[str, Any]]], None] | None = None,
    interval: float = 1.0,
    log_task: int | None = CHIEF_TASK,
) -> dict[str, Any]:
    """Calls `on_job` with each polled job (and `on_log_lines` with new lines) until it and every task of
    its newest attempt have ended; returns it (its tasks still running if they did not end in time).

    Outages of the coordinator (a restart) are waited out as `Job.wait` does.
    """
    cursor: list[int | None] = [None]

    def on_progress(job: Job) -> None:
        if on_log_lines is not None:
            cursor[0] = _deliver_new_lines(client, job_id, log_task, cursor[0], on_log_lines)
        on_job(job.raw)

    job = Job(client, {"id": job_id})
    job.wait(on_progress=on_progress, poll_interval=interval, raise_on_failure=False)
    if on_log_lines is not None:
        # Lines written just before the end may land after the state change: take a last look.
        _deliver_new_lines(client, job_id, log_task, cursor[0], on_log_lines)
    return job.raw


def _deliver_new_lines(
    client: Client,
    job_id: str,
    task: int | None,
    after: int | None,
    on_log_lines: Callable[[list[dict[str, Any]]], None],
) -> int | None:
    """Fetches every line past `after` (page by page) and returns the new cursor."""
    while True:
        page = client.log_page(job_id, task=task, after=after)
        if page.lines:
            on_log_lines([line.raw for line in page.lines])
        next_after = after if page.next_after is None else page.next_after
        if not page.lines or next_after == after:
            return next_after
        after = next_after


def tail_of_task_logs(client: Client, job_id: str, task: int, attempt: int | None, count: int) -> list[str]:
    """The last `count` lines of one task's log (of `attempt`, or of whatever the API picks), made
    `terminal_safe` for printing."""
    page = client.log_page(job_id, task=task, attempt=attempt, tail=count)
    return [terminal_safe(line.text) for line in page.lines]
