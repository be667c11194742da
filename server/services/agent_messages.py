"""What the coordinator does with each kind of message on an agent's session, one transaction each.

Items of a message are contained on their own: a task report of a Hello that cannot be applied is
skipped (server.poison), a log line or metric point that cannot be stored is refused with a reason in the
acknowledgement; the other items of the message are applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from server.db.models import Job, Task, utcnow
from server.poison import isolated
from server.services.agents import get_agent, touch_agent
from server.services.jobs import end_job, fail_on_nan_metric
from server.services.tasks import (
    ReportOutcome,
    TaskReport,
    active_tasks_on_agent,
    apply_report,
    mark_task_lost,
    tasks_to_start,
    tasks_to_stop,
)
from server.services.telemetry import (
    IncomingLine,
    IncomingPoint,
    StoreOutcome,
    store_log_lines,
    store_metric_points,
)
from server.states import JobState

log = logging.getLogger("mwms.server.agent_messages")


@dataclass
class Replies:
    """What to send back: acknowledgements of final states, and tasks the agent must stop."""

    final_acks: list[str] = field(default_factory=list)
    stop_ids: list[str] = field(default_factory=list)
    changed: bool = False  # job state may have changed: wake the scheduler and other sessions

    def add(self, task_id: str, outcome: ReportOutcome) -> None:
        if outcome.final:
            self.final_acks.append(task_id)
        if outcome.stop:
            self.stop_ids.append(task_id)
        self.changed = True


def accept_hello(
    session: Session, agent_id: str, reports: list[TaskReport], *, timeout_s: float, backoff_base_s: float
) -> Replies:
    """An agent (re)connected: apply what it reports; tasks it should run but does not know are lost."""
    now = utcnow()
    agent = get_agent(session, agent_id)
    touch_agent(agent, timeout_s, now)
    replies = Replies()
    for report in reports:
        what = f"report {report.state.value} of task {report.task_id} from agent {agent_id}"
        with isolated(session, log, "task_report", f"{report.task_id}/{report.state.value}", what):
            outcome = apply_report(session, agent, report, backoff_base_s=backoff_base_s, now=now)
            replies.add(report.task_id, outcome)
    known = {r.task_id for r in reports}
    for task in active_tasks_on_agent(session, agent_id):
        if task.id not in known:
            mark_task_lost(
                session,
                agent,
                task,
                "lost (its agent restarted and no longer runs it)",
                backoff_base_s,
                now,
            )
            replies.changed = True
    return replies


def accept_report(session: Session, agent_id: str, report: TaskReport, *, backoff_base_s: float) -> Replies:
    agent = get_agent(session, agent_id)
    replies = Replies()
    replies.add(report.task_id, apply_report(session, agent, report, backoff_base_s=backoff_base_s))
    return replies


def accept_heartbeat(session: Session, agent_id: str, *, timeout_s: float) -> None:
    touch_agent(get_agent(session, agent_id), timeout_s)


def accept_logs(
    session: Session, agent_id: str, task_id: str, lines: list[IncomingLine], *, timeout_s: float
) -> StoreOutcome:
    """Stores a batch of log lines; all of them are acknowledged (even for unknown tasks).

    Any message proves the agent alive, so a long backlog cannot make a busy agent look lost.
    """
    touch_agent(get_agent(session, agent_id), timeout_s)
    task = session.get(Task, task_id)
    if task is None or task.agent_id != agent_id:
        return StoreOutcome(acked_seq=max((line.seq for line in lines), default=0))
    return store_log_lines(session, task, lines)


def accept_metrics(
    session: Session, agent_id: str, task_id: str, points: list[IncomingPoint], *, timeout_s: float
) -> StoreOutcome:
    """Stores a batch of metric points; a NaN of a restart.fail_on_nan metric fails the job."""
    touch_agent(get_agent(session, agent_id), timeout_s)
    task = session.get(Task, task_id)
    if task is None or task.agent_id != agent_id:
        return StoreOutcome(acked_seq=max((p.seq for p in points), default=0))
    outcome = store_metric_points(session, task, points)
    if outcome.nan_points:
        job = session.get(Job, task.job_id)
        for point in outcome.nan_points:
            if job is not None and fail_on_nan_metric(session, job, task, point.name, point.step):
                outcome.changed = True
                break
    return outcome


def refuse_start(session: Session, task_id: str, reason: str) -> bool:
    """A task whose start command cannot be sent: its job fails with `reason`; True when it changed."""
    task = session.get(Task, task_id)
    job = session.get(Job, task.job_id) if task is not None else None
    if task is None or job is None or JobState(job.state).terminal:
        return False
    end_job(session, job, JobState.FAILED, f"task {task.index} cannot be started: {reason}")
    return True


def pending_commands(session: Session, agent_id: str) -> tuple[list[tuple[Task, Job]], list[Task]]:
    """(tasks to start, tasks to stop) on this agent, as the database says now."""
    return tasks_to_start(session, agent_id), tasks_to_stop(session, agent_id)
