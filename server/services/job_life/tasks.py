"""What agents report about tasks: each report applied to its task, and what the agent must do next.

What a task's change means for its attempt and job is decided in server/services/job_life/lifecycle.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Task, utcnow
from mwms.server.observability.instruments import count_task_start
from mwms.server.services.job_life.lifecycle import after_task_change
from mwms.server.services.job_life.transitions import transition_task
from mwms.server.services.storage.environments import fail_disagreeing_attempt, note_environment
from mwms.server.states import TASK_TRANSITIONS, TaskState

log = logging.getLogger("mwms.server.tasks")


@dataclass(frozen=True)
class TaskReport:
    task_id: str
    state: TaskState
    exit_code: int | None = None
    message: str = ""
    pid: int | None = None
    environment: str = ""  # "building" or "ready" (the job's own environment on the agent); "": no news
    environment_build_s: float | None = None  # with "ready": the build's seconds, 0 from the agent's cache
    environment_digest: str = ""  # with "ready": what it holds, hashed (workers must agree)
    environment_platform: str = ""  # with "ready": the Python and platform it was built for
    peak_memory_bytes: int = 0  # the most its cgroup has held so far; 0: unknown
    memory_limit_bytes: int = 0  # the memory limit its agent applied; 0: none
    start_kind: str = ""  # with RUNNING: "warm" (a warm interpreter ran it) or "cold"; "": not said


@dataclass(frozen=True)
class ReportOutcome:
    known: bool  # the coordinator has this task and it belongs to the reporting agent
    final: bool  # the task's terminal state is stored
    stop: bool  # the agent should stop this task (unknown, or its attempt is over)


def apply_report(
    session: Session, agent: Agent, report: TaskReport, *, backoff_base_s: float, now: datetime | None = None
) -> ReportOutcome:
    """Applies one agent report; idempotent, so resent reports change nothing."""
    now = now or utcnow()
    task = session.get(Task, report.task_id)
    if task is None or task.agent_id != agent.id:
        return ReportOutcome(known=False, final=report.state.terminal, stop=not report.state.terminal)
    note_memory(task, report)
    current = TaskState(task.state)
    differing = (
        note_environment(session, task, report, now) if report.environment and not current.terminal else None
    )
    if differing is not None:
        fail_disagreeing_attempt(session, task, differing, backoff_base_s, now)
        return ReportOutcome(known=True, final=False, stop=True)
    if current.terminal and not report.state.terminal:
        # Still running on the agent although its attempt is over (e.g. the agent was cut off): stop it.
        return ReportOutcome(known=True, final=False, stop=True)
    if current == report.state or (current.terminal and current != TaskState.LOST):
        return ReportOutcome(known=True, final=current.terminal, stop=False)
    if report.state in (TaskState.STARTING, TaskState.RUNNING) and current.value not in (
        TaskState.ASSIGNED.value,
        TaskState.STARTING.value,
    ):
        return ReportOutcome(known=True, final=False, stop=task.stop_requested)
    if report.pid:
        task.pid = report.pid
    # A refused task, or one stopped before its spawn, never ran: it has no exit code (the agent's 0
    # would read as "exited 0").
    never_ran = report.state == TaskState.REJECTED or (
        report.state == TaskState.STOPPED and not (report.pid or task.pid) and not report.exit_code
    )
    if report.exit_code is not None and report.state.terminal and not never_ran:
        task.exit_code = report.exit_code
    if report.state not in TASK_TRANSITIONS[current]:
        # A late or out-of-order report (e.g. REJECTED for a task already LOST): keep what is recorded.
        log.warning("ignoring report %s for task %s in state %s", report.state.value, task.id, current.value)
        return ReportOutcome(known=True, final=report.state.terminal, stop=not report.state.terminal)
    transition_task(session, task, report.state, report.message, now)
    if report.state == TaskState.RUNNING and report.start_kind:
        count_task_start(session, report.start_kind)
    if current == TaskState.LOST:
        return ReportOutcome(known=True, final=True, stop=False)
    after_task_change(session, agent, task, backoff_base_s, now)
    return ReportOutcome(
        known=True, final=report.state.terminal, stop=task.stop_requested and not report.state.terminal
    )


def note_memory(task: Task, report: TaskReport) -> None:
    """Keeps the highest peak memory the agent reported for the task, and the limit it applied (a report
    without them, 0, changes nothing: an agent without cgroups, or one older than the fields)."""
    if report.peak_memory_bytes > 0 and report.peak_memory_bytes > (task.peak_memory_bytes or 0):
        task.peak_memory_bytes = report.peak_memory_bytes
    if report.memory_limit_bytes > 0 and report.memory_limit_bytes != task.memory_limit_bytes:
        task.memory_limit_bytes = report.memory_limit_bytes


# An agent's tasks it should be running or starting: one it no longer knows of is lost.
_ACTIVE_STATES = [TaskState.STARTING.value, TaskState.RUNNING.value]


def agents_with_active_tasks(session: Session, agent_ids: list[str]) -> set[str]:
    """Which of the agents have a task STARTING or RUNNING, in one query a thousand agents."""
    busy: set[str] = set()
    for start in range(0, len(agent_ids), 1000):
        busy.update(
            session.scalars(
                select(Task.agent_id)
                .where(
                    Task.agent_id.in_(agent_ids[start : start + 1000]),
                    Task.state.in_(_ACTIVE_STATES),
                )
                .distinct()
            ).all()
        )
    return busy


def active_tasks_on_agent(session: Session, agent_id: str) -> list[Task]:
    """Tasks the agent should be running or starting (so an agent that forgot them lost them)."""
    return list(
        session.scalars(
            select(Task).where(
                Task.agent_id == agent_id,
                Task.state.in_(_ACTIVE_STATES),
            )
        ).all()
    )
