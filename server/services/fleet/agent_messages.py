"""What the coordinator does with each kind of message on an agent's session, and the commands it holds.

Hellos, task reports and goodbyes are one transaction each; log and metric batches of many agents share
one (accept_telemetry); heartbeats write nothing here (server/live/liveness.py).

Items of a message are contained on their own: a task report of a Hello that cannot be applied is
skipped (mwms.server.poison), a log line or metric point that cannot be stored is refused with a reason in the
acknowledgement; the other items of the message are applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, Task, utcnow
from mwms.server.observability.event_log import log_after_commit
from mwms.server.poison import is_transient, isolated
from mwms.server.services.fleet import replicas
from mwms.server.services.fleet.agents import get_agent, mark_stopped, touch_agent
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.lifecycle import end_job, fail_on_nan_metric, mark_task_lost
from mwms.server.services.job_life.tasks import (
    ReportOutcome,
    TaskReport,
    active_tasks_on_agent,
    apply_report,
)
from mwms.server.services.observing.telemetry import (
    IncomingLine,
    IncomingPoint,
    StoreOutcome,
    store_log_lines,
    store_metric_points,
)
from mwms.server.states import JobState, TaskState

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
    session: Session,
    agent_id: str,
    reports: list[TaskReport],
    *,
    timeout_s: float,
    backoff_base_s: float,
    had_active_tasks: bool = True,
) -> Replies:
    """An agent (re)connected: apply what it reports; tasks it should run but does not know are lost.

    `had_active_tasks` False: the caller read, in this transaction under the writer lock, that the agent
    had no task STARTING or RUNNING; none can become so but by this hello's own reports, so there is none
    to lose and they are not read again (a hello of a fresh agent costs a round trip less)."""
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
    for task in active_tasks_on_agent(session, agent_id) if had_active_tasks else []:
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


# A goodbye's reason is for people (the coordinator's log): cut to this many characters, unprintable ones
# replaced, so an agent cannot fill the log or write control sequences into it.
MAX_GOODBYE_REASON = 200


def goodbye_reason(text: str) -> str:
    """The reason of a Goodbye as the coordinator logs it: printable, at most MAX_GOODBYE_REASON characters."""
    cut = text if len(text) <= MAX_GOODBYE_REASON else text[: MAX_GOODBYE_REASON - 3] + "..."
    return "".join(c if c.isprintable() else "?" for c in cut).strip() or "no reason given"


def accept_goodbye(
    session: Session, agent_id: str, reason: str, *, replica_id: str, epoch: int | None
) -> bool:
    """The agent stopped cleanly (its last message, after its tasks' final reports): it reads as stopped,
    not online and never lost, until it registers, says hello or is heard from on a later stream; the
    stream (`epoch` on `replica_id`) holds it no more. Tasks still open on it are ended by the reconciler
    (reconcile.end_tasks_of_stopped_agents). False, and nothing written, for a stream a newer one of the
    agent superseded: the agent is talking elsewhere."""
    agent = get_agent(session, agent_id)
    if epoch is not None and agent.stream_epoch != epoch:
        return False
    mark_stopped(agent)
    if epoch is not None:
        replicas.release_stream(session, agent_id, replica_id, epoch)
    reason = goodbye_reason(reason)
    log_after_commit(
        session,
        f"agent {agent.name} ({agent.id}) stopped cleanly: {reason}",
        event="agent_stopped",
        agent=agent.name,
        agent_id=agent.id,
        reason=reason,
    )
    return True


def accept_report(session: Session, agent_id: str, report: TaskReport, *, backoff_base_s: float) -> Replies:
    agent = get_agent(session, agent_id)
    replies = Replies()
    replies.add(report.task_id, apply_report(session, agent, report, backoff_base_s=backoff_base_s))
    return replies


@dataclass(frozen=True)
class TelemetryBatch:
    """One LogBatch or MetricBatch from an agent's stream, as the telemetry writer queues it."""

    agent_id: str
    task_id: str
    lines: list[IncomingLine] | None = None
    points: list[IncomingPoint] | None = None


def accept_telemetry(session: Session, batches: list[TelemetryBatch]) -> list[StoreOutcome | Exception]:
    """Stores log and metric batches of many agents in one transaction, each in a savepoint of its own.

    A batch that cannot be applied gets its exception as its outcome (its stream refuses it, or ends
    when its agent was removed); the others are stored. A database that cannot be written at all
    (a transient error) fails the whole call, so every agent resends.
    """
    held = hold_rows(session, Agent, {b.agent_id for b in batches}) + hold_rows(
        session, Task, {b.task_id for b in batches}
    )
    outcomes: list[StoreOutcome | Exception] = []
    for batch in batches:
        try:
            with session.begin_nested():
                if batch.lines is not None:
                    outcomes.append(accept_logs(session, batch.agent_id, batch.task_id, batch.lines))
                else:
                    outcomes.append(
                        accept_metrics(session, batch.agent_id, batch.task_id, batch.points or [])
                    )
        except Exception as error:  # noqa: BLE001 - one batch must not fail the others
            if is_transient(error):
                raise
            outcomes.append(error)
    del held
    return outcomes


# Ids per query when rows are read by id: well within SQLite's and PostgreSQL's bounds on parameters.
IDS_PER_QUERY = 500


def hold_rows(
    session: Session, model: type[Agent] | type[Task] | type[Attempt] | type[Job], ids: set[str]
) -> list[Any]:
    """Reads the rows of `ids` in a few queries and returns them, for the caller to hold: while held, the
    session's `get` finds them without a query (it keeps only the objects something references), so a
    transaction of hundreds of batches, hellos or reports reads each one's agent and task once, not once
    or twice per item."""
    ordered = sorted(ids)
    rows: list[Any] = []
    for start in range(0, len(ordered), IDS_PER_QUERY):
        chunk = ordered[start : start + IDS_PER_QUERY]
        rows += session.scalars(select(model).where(model.id.in_(chunk))).all()
    return rows


def hold_rows_of_reports(session: Session, reports: list[tuple[str, TaskReport]]) -> list[Any]:
    """For a transaction of task reports (server/live/report_writer.py): their agents, tasks, and the
    tasks' attempts and jobs, to hold. A gang's 64 reports share one attempt and one job, which each
    report read again (and an attempt's ending, its tasks again) once the last had left the session."""
    agents = hold_rows(session, Agent, {agent_id for agent_id, _ in reports})
    tasks = hold_rows(session, Task, {report.task_id for _, report in reports})
    attempts = hold_rows(session, Attempt, {task.attempt_id for task in tasks})
    return agents + tasks + attempts + hold_rows(session, Job, {task.job_id for task in tasks})


def accept_logs(session: Session, agent_id: str, task_id: str, lines: list[IncomingLine]) -> StoreOutcome:
    """Stores a batch of log lines; all of them are acknowledged (even for unknown tasks).

    Liveness is not written here: every message marks its agent alive in memory (server/live/liveness.py).
    """
    get_agent(session, agent_id)  # Unauthenticated once an admin removed the agent
    task = session.get(Task, task_id)
    if task is None or task.agent_id != agent_id:
        return StoreOutcome(acked_seq=max((line.seq for line in lines), default=0))
    return store_log_lines(session, task, lines)


def accept_metrics(
    session: Session, agent_id: str, task_id: str, points: list[IncomingPoint]
) -> StoreOutcome:
    """Stores a batch of metric points; a NaN of a restart.fail_on_nan metric fails the job."""
    get_agent(session, agent_id)
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
    ending = attempt_endings.start_failed(task, reason)
    end_job(session, job, JobState.FAILED, f"task {task.index} cannot be started: {reason}", ending=ending)
    return True


@dataclass
class Commands:
    """What one agent must be told now: tasks to start (with their jobs) and tasks to stop."""

    starts: list[tuple[Task, Job]] = field(default_factory=list)
    stops: list[Task] = field(default_factory=list)
    # Every agent's task port range, merged: no task may bind them but its own port, nor reach them but
    # at its own job's peers (StartTask.guarded_ports, worker_agent/port_guard.py).
    guarded_ports: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class PendingCommands:
    """Commands per agent, and agents whose sessions must end (removed by an admin, or unknown)."""

    by_agent: dict[str, Commands] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # agent id -> why its session ends
    # agent id -> (replica holding its stream, stream epoch), as the database says (server/live/hub.py)
    streams: dict[str, tuple[str | None, int]] = field(default_factory=dict)


def agent_port_ranges(session: Session) -> list[tuple[int, int]]:
    """The task port ranges of every agent not removed, merged (one query)."""
    rows = session.execute(
        select(Agent.port_low, Agent.port_high).where(Agent.removed_at.is_(None)).distinct()
    ).all()
    merged: list[list[int]] = []
    for low, high in sorted((int(a), int(b)) for a, b in rows if a and b and a <= b):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return [(a, b) for a, b in merged]


def pending_commands(session: Session, agent_ids: list[str]) -> PendingCommands:
    """The start and stop commands the database holds for `agent_ids`, in a fixed number of queries."""
    result = PendingCommands()
    if not agent_ids:
        return result
    agents = {a.id: a for a in session.scalars(select(Agent).where(Agent.id.in_(agent_ids))).all()}
    for agent_id in agent_ids:
        agent = agents.get(agent_id)
        if agent is not None:
            result.streams[agent_id] = (agent.stream_replica, agent.stream_epoch)
        if agent is None:
            result.refused[agent_id] = f"no agent with id {agent_id}; the agent must register again"
        elif agent.removed_at is not None:
            result.refused[agent_id] = f"agent {agent.name!r} was removed by an admin; its credential is void"
    live = [a for a in agent_ids if a not in result.refused]
    if not live:
        return result
    # Starts: tasks placed on the agent and not asked to stop. Stops: tasks asked to stop and not known to
    # have ended, or LOST (a cut-off agent may still run them; its STOPPED or "not running" closes them).
    starts = session.execute(
        select(Task, Job)
        .join(Job, Job.id == Task.job_id)
        .where(
            Task.agent_id.in_(live), Task.state == TaskState.ASSIGNED.value, Task.stop_requested.is_(False)
        )
        .order_by(Task.created_at, Task.index)
    ).all()
    guarded = agent_port_ranges(session) if starts else []
    for task, job in starts:
        commands = result.by_agent.setdefault(task.agent_id, Commands())
        commands.starts.append((task, job))
        commands.guarded_ports = guarded
    open_states = [s.value for s in TaskState if not s.terminal]
    stops = session.scalars(
        select(Task).where(
            Task.agent_id.in_(live),
            or_(
                and_(Task.stop_requested.is_(True), Task.state.in_(open_states)),
                Task.state == TaskState.LOST.value,
            ),
        )
    ).all()
    for task in stops:
        result.by_agent.setdefault(task.agent_id, Commands()).stops.append(task)
    return result
