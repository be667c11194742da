"""What a failure reads and how it is recorded: the reason a failed worker's peers are stopped with, the
failing task's description and last log lines (each line's newest state: no redrawn ones), the attempt
ending its failure makes (server/services/job_life/attempt_endings.py) and how its restart is counted in
mwms_job_restarts_total.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, LogLine, Task
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.attempt_endings import AttemptEnding
from mwms.server.states import TaskState

FAILURE_LOG_LINES = 10
# Characters of each of those lines a reason quotes (a line holds up to 64 KiB; the log has it whole).
FAILURE_LINE_CHARS = 1000


def worker_failed_reason(failed: Task) -> str:
    """What a peer of `failed` reads when it is stopped because `failed` ended on its own."""
    what = "was lost" if failed.state == TaskState.LOST.value else "failed"
    return f"stopped because worker {failed.index} {what}"


def peer_stop_reason(ending: AttemptEnding | None) -> str:
    """What the tasks still running read when their attempt fails: the worker that failed, when one did."""
    failed = ending.details.get("task") if ending is not None else None
    if not isinstance(failed, int) or ending is None:
        return "stopped because its attempt failed"
    what = "was lost" if ending.kind == "agent_lost" else "failed"
    return f"stopped because worker {failed} {what}"


def last_log_lines(session: Session, task: Task, count: int = FAILURE_LOG_LINES) -> list[str]:
    """The task's last `count` log lines, oldest first (each line's newest state: no redrawn ones), each cut
    to FAILURE_LINE_CHARS: a reason is stored with the attempt and the job and shown in lists."""
    rows = session.scalars(
        select(func.substr(LogLine.text, 1, FAILURE_LINE_CHARS + 1))
        .where(LogLine.task_id == task.id, LogLine.superseded.is_(False))
        .order_by(LogLine.seq.desc())
        .limit(count)
    ).all()
    return [_quoted(text) for text in reversed(rows)]


def _quoted(text: str) -> str:
    if len(text) <= FAILURE_LINE_CHARS:
        return text
    return text[:FAILURE_LINE_CHARS] + " … (line cut: the log has it whole)"


def describe_task_failure(session: Session, task: Task, agent_name: str) -> tuple[str, list[str]]:
    """('task 1 on agent X: exited with code 3', its last log lines)."""
    head = f"task {task.index} on agent {agent_name}: " + (
        task.message or f"exited with code {task.exit_code}"
    )
    return head, last_log_lines(session, task)


def failure_ending(task: Task, agent: Agent | None) -> AttemptEnding:
    """The ending an attempt gets from the task whose failure ends it: its agent lost, or its own exit."""
    if task.state == TaskState.LOST.value:
        return attempt_endings.agent_lost(task, agent)
    return attempt_endings.task_failed(task, agent.name if agent else task.agent_id)


def restart_cause(task: Task) -> str:
    """How the task that ends its attempt is counted in mwms_job_restarts_total."""
    if task.state == TaskState.LOST.value:
        return "agent_lost"
    if task.exit_code is not None and (task.exit_code >= 128 or task.exit_code < 0):
        return "signal"
    return "exit_code" if task.exit_code else "other"
