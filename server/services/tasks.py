"""What agents report about tasks, applied to tasks, attempts and jobs; and what agents must do next."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db.models import Agent, Attempt, Job, Task, utcnow
from server.services.jobs import (
    describe_task_failure,
    fail_attempt,
    is_retryable,
    replace_attempt,
    request_stop,
)
from server.services.transitions import transition_job, transition_task
from server.states import TASK_TRANSITIONS, AttemptState, JobState, TaskState

log = logging.getLogger("mwms.server.tasks")


@dataclass(frozen=True)
class TaskReport:
    task_id: str
    state: TaskState
    exit_code: int | None = None
    message: str = ""
    pid: int | None = None


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
    current = TaskState(task.state)
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
    if report.exit_code is not None and report.state.terminal:
        task.exit_code = report.exit_code
    if report.state not in TASK_TRANSITIONS[current]:
        # A late or out-of-order report (e.g. REJECTED for a task already LOST): keep what is recorded.
        log.warning("ignoring report %s for task %s in state %s", report.state.value, task.id, current.value)
        return ReportOutcome(known=True, final=report.state.terminal, stop=not report.state.terminal)
    transition_task(session, task, report.state, report.message, now)
    if current == TaskState.LOST:
        return ReportOutcome(known=True, final=True, stop=False)
    _after_task_change(session, agent, task, backoff_base_s, now)
    return ReportOutcome(
        known=True, final=report.state.terminal, stop=task.stop_requested and not report.state.terminal
    )


def _after_task_change(
    session: Session, agent: Agent, task: Task, backoff_base_s: float, now: datetime
) -> None:
    attempt = session.get(Attempt, task.attempt_id)
    job = session.get(Job, task.job_id)
    assert attempt is not None and job is not None
    state = TaskState(task.state)
    if attempt.state != AttemptState.ACTIVE.value:
        return
    if state == TaskState.RUNNING:
        if job.state == JobState.SCHEDULED.value and all(
            t.state == TaskState.RUNNING.value for t in attempt.tasks
        ):
            transition_job(
                session,
                job,
                JobState.RUNNING,
                "every worker is running" if len(attempt.tasks) > 1 else "the worker is running",
                now,
            )
    elif state == TaskState.SUCCEEDED:
        if all(t.state == TaskState.SUCCEEDED.value for t in attempt.tasks):
            attempt.state = AttemptState.SUCCEEDED.value
            attempt.ended_at = now
            attempt.reason = "every task exited 0"
            if job.state == JobState.SCHEDULED.value:
                transition_job(session, job, JobState.RUNNING, "all workers started", now)
            transition_job(
                session,
                job,
                JobState.SUCCEEDED,
                "every task exited 0" if len(attempt.tasks) > 1 else "the task exited 0",
                now,
            )
        else:  # the last task of a failing attempt may end with 0 before its stop arrives
            _settle_failed_attempt(session, job, attempt, backoff_base_s, now)
    elif state == TaskState.REJECTED:
        replace_attempt(
            session,
            job,
            attempt,
            f"agent {agent.name} could not start task {task.index}: {task.message}",
            now,
        )
    elif state in (TaskState.FAILED, TaskState.STOPPED, TaskState.LOST):
        if _is_cause(task):
            for other in attempt.tasks:
                request_stop(other, f"attempt {attempt.number} is ending: task {task.index} failed")
        _settle_failed_attempt(session, job, attempt, backoff_base_s, now)


def _is_cause(task: Task) -> bool:
    """Ended on its own (not because it was asked to stop), or lost with its agent."""
    state = TaskState(task.state)
    if state == TaskState.LOST:
        return True
    return state in (TaskState.FAILED, TaskState.STOPPED) and not task.stop_requested


def _settle_failed_attempt(
    session: Session, job: Job, attempt: Attempt, backoff_base_s: float, now: datetime
) -> None:
    """Decides between restart and failure for an attempt that has a failed task.

    A retryable cause (a signal, a lost agent) decides at once. A permanent one (exit code 1-127) waits
    until every task has ended, because the first failure seen is often a consequence: when one worker is
    killed or its machine is lost, the survivors' collectives fail with exit code 1 within seconds, before
    the lost agent is detected. A retryable cause anywhere in the gang makes the attempt retryable, and
    it is named in the reason.
    """
    causes = [t for t in attempt.tasks if _is_cause(t)]
    if not causes:
        return
    restart_on = job.options.get("restart", {}).get("restart_on", "retryable")
    retryable = [t for t in causes if is_retryable(t.exit_code, t.state == TaskState.LOST.value, restart_on)]
    if not retryable and not all(TaskState(t.state).terminal for t in attempt.tasks):
        return  # only permanent causes so far: a retryable one may still explain them
    root = min(retryable or causes, key=lambda t: (t.ended_at or now, t.index))
    agent = session.get(Agent, root.agent_id)
    reason, tail = describe_task_failure(session, root, agent.name if agent else root.agent_id)
    fail_attempt(
        session,
        job,
        attempt,
        reason,
        retryable=bool(retryable),
        backoff_base_s=backoff_base_s,
        now=now,
        log_tail=tail,
        cause=_restart_cause(root),
    )


def _restart_cause(task: Task) -> str:
    """How the task that ends its attempt is counted in mwms_job_restarts_total."""
    if task.state == TaskState.LOST.value:
        return "agent_lost"
    if task.exit_code is not None and (task.exit_code >= 128 or task.exit_code < 0):
        return "signal"
    return "exit_code" if task.exit_code else "other"


def mark_task_lost(
    session: Session, agent: Agent, task: Task, why: str, backoff_base_s: float, now: datetime
) -> None:
    """Ends a task whose agent is gone or no longer knows it, and lets its attempt react."""
    if TaskState(task.state).terminal:
        return
    transition_task(session, task, TaskState.LOST, why, now)
    _after_task_change(session, agent, task, backoff_base_s, now)


def active_tasks_on_agent(session: Session, agent_id: str) -> list[Task]:
    """Tasks the agent should be running or starting (so an agent that forgot them lost them)."""
    return list(
        session.scalars(
            select(Task).where(
                Task.agent_id == agent_id,
                Task.state.in_([TaskState.STARTING.value, TaskState.RUNNING.value]),
            )
        ).all()
    )
