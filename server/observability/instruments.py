"""The coordinator's counters and histograms (the process-wide prometheus_client registry), and the few
functions the services call to feed them.

Names are stable (`mwms_...`), documented in the README's metric list (a test keeps it true) and used by
deploy/grafana/mwms-dashboard.json. State changes are observed only once their transaction commits
(mwms.server.observability.on_commit). The hot paths (heartbeats, telemetry) pay one observation per message
or one increment per committed transaction, never one per item.
"""

from __future__ import annotations

import platform
from datetime import datetime

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from sqlalchemy import func, select
from sqlalchemy.orm import Session

import mwms
from mwms.priorities import PRIORITY_BANDS, priority_band
from mwms.server.db.models import Job, JobEvent
from mwms.server.observability.on_commit import on_commit
from mwms.server.states import TERMINAL_JOB_STATES, JobState

# No `<name>_created` series: nothing reads them, they double the series and the text format shows them
# as gauges of their own. Process-wide, so mwms_poison_total and the hang detector's counter lose theirs too.
disable_created_metrics()

# Seconds: from a second (a placed gang on idle agents) to hours (a queue behind a long job).
_WAIT_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
_DURATION_BUCKETS = (10, 30, 60, 300, 600, 1800, 3600, 2 * 3600, 6 * 3600, 12 * 3600, 24 * 3600, 72 * 3600)
_ROUND_TRIP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

SCHEDULING_LATENCY = Histogram(
    "mwms_scheduling_latency_seconds",
    "Time from a job's submit (first attempt) or its return to PENDING (a restart) to every task RUNNING",
    ["attempt"],  # "first" or "restart"
    buckets=_WAIT_BUCKETS,
)
QUEUE_WAIT = Histogram(
    "mwms_job_queue_wait_seconds",
    "Time a job waited in the queue (since submit, or since it became PENDING again) until it was placed, "
    "by priority band (low < 250 <= normal < 750 <= high)",
    ["band"],
    buckets=_WAIT_BUCKETS,
)
JOB_DURATION = Histogram(
    "mwms_job_duration_seconds",
    "Time from a job's submit to its terminal state, by that state",
    ["state"],
    buckets=_DURATION_BUCKETS,
)
HEARTBEAT_ROUND_TRIP = Histogram(
    "mwms_heartbeat_round_trip_seconds",
    "Round trip of agents' heartbeats (agent sends, coordinator answers), as the agents measured it",
    buckets=_ROUND_TRIP_BUCKETS,
)
EVENT_LOOP_LAG = Histogram(
    "mwms_event_loop_lag_seconds",
    "How late the coordinator's event loop ran a timer that was due (heartbeat answers and REST calls wait "
    "as long); sampled 10 times a second",
    buckets=_ROUND_TRIP_BUCKETS,
)
SCHEDULER_PASS = Histogram(
    "mwms_scheduler_pass_seconds",
    "Time one scheduler pass took to read, plan and apply (in the scheduler process, when it runs there)",
    buckets=_ROUND_TRIP_BUCKETS,
)
API_REQUEST_LATENCY = Histogram(
    "mwms_api_request_duration_seconds",
    "REST API requests: time until the response starts, by route template, method and status class",
    ["route", "method", "status"],
    buckets=_REQUEST_BUCKETS,
)
METRIC_POINTS_INGESTED = Counter(
    "mwms_metric_points_ingested",
    "Metric points from agents that the coordinator committed and acknowledged (refused ones excluded)",
)
LOG_LINES_INGESTED = Counter(
    "mwms_log_lines_ingested",
    "Log lines from agents that the coordinator committed and acknowledged (refused ones excluded)",
)
JOB_RESTARTS = Counter(
    "mwms_job_restarts",
    "Attempts restarted after a retryable failure, by cause (agent_lost, signal, exit_code, "
    "startup_timeout, hang, other)",
    ["cause"],
)
JOB_PREEMPTIONS = Counter(
    "mwms_job_preemptions",
    "Jobs preempted, by cause: priority (for a higher-priority job), reclaim (a team taking back its quota "
    "from a borrower), drain (an admin drained an agent)",
    ["cause"],
)
for _cause in ("priority", "reclaim", "drain"):
    JOB_PREEMPTIONS.labels(cause=_cause)
AGENT_REGISTRATIONS = Counter(
    "mwms_agent_registrations", "Agent registrations accepted (new agents and agents registering again)"
)
TASK_STARTS = Counter(
    "mwms_task_starts",
    "Task processes started, by kind: warm (a warm interpreter of the agent's pool, TensorFlow imported "
    "already) or cold (a new process); as the agents said with the tasks' RUNNING reports",
    ["kind"],
)
AGENT_COMMANDS = Counter(
    "mwms_agent_commands_sent", "Commands sent to agents on their streams, by kind (start, stop)", ["kind"]
)

BUILD_INFO = Gauge(
    "mwms_build_info",
    "1, labelled with the coordinator's version and the Python it runs on (alerts and dashboards join on it)",
    ["version", "python"],
)
BUILD_INFO.labels(version=mwms.__version__, python=platform.python_version()).set(1)

RESTART_CAUSES = ("agent_lost", "signal", "exit_code", "startup_timeout", "hang", "other")
# Series that exist from the start (at 0), so dashboards and alerts see them before the first event.
for _cause in RESTART_CAUSES:
    JOB_RESTARTS.labels(cause=_cause)
for _kind in ("start", "stop"):
    AGENT_COMMANDS.labels(kind=_kind)
for _kind in ("warm", "cold"):
    TASK_STARTS.labels(kind=_kind)
for _state in TERMINAL_JOB_STATES:
    JOB_DURATION.labels(state=_state.value)
for _attempt in ("first", "restart"):
    SCHEDULING_LATENCY.labels(attempt=_attempt)
for _band in PRIORITY_BANDS:
    QUEUE_WAIT.labels(band=_band)


def observe_job_transition(
    session: Session, job: Job, previous: JobState | None, to: JobState, now: datetime
) -> None:
    """Scheduling latency when an attempt reaches RUNNING, duration when the job ends; after commit."""
    if to == JobState.RUNNING and previous != JobState.RUNNING:
        # The first attempt counts from the submit (an agent that refused its task and the new placement
        # included); a restart from its return to PENDING after the backoff: one indexed read per attempt.
        attempt = "first" if job.restarts == 0 else "restart"
        queued_at = job.created_at if attempt == "first" else _last_pending(session, job.id)
        if queued_at is not None:
            waited = max(0.0, (now - queued_at).total_seconds())
            on_commit(session, lambda: SCHEDULING_LATENCY.labels(attempt=attempt).observe(waited))
    elif to.terminal and job.created_at is not None:
        lasted = max(0.0, (now - job.created_at).total_seconds())
        on_commit(session, lambda: JOB_DURATION.labels(state=to.value).observe(lasted))


def _last_pending(session: Session, job_id: str) -> datetime | None:
    return session.scalar(
        select(func.max(JobEvent.at)).where(
            JobEvent.job_id == job_id, JobEvent.to_state == JobState.PENDING.value
        )
    )


def count_restart(session: Session, cause: str) -> None:
    """One attempt restarted for `cause` (one of RESTART_CAUSES), once committed."""
    label = cause if cause in RESTART_CAUSES else "other"
    on_commit(session, JOB_RESTARTS.labels(cause=label).inc)


def observe_queue_wait(session: Session, priority: int, seconds: float) -> None:
    """A job placed after waiting `seconds`, once committed."""
    band = priority_band(priority)
    on_commit(session, lambda: QUEUE_WAIT.labels(band=band).observe(max(0.0, seconds)))


def count_preemption(session: Session, cause: str) -> None:
    """One job preempted for `cause` (priority, reclaim or drain), once committed."""
    on_commit(session, JOB_PREEMPTIONS.labels(cause=cause).inc)


def count_registration(session: Session) -> None:
    """One agent registration, once committed."""
    on_commit(session, AGENT_REGISTRATIONS.inc)


def count_task_start(session: Session, kind: str) -> None:
    """One task process started, warm or cold, once its RUNNING state is committed."""
    if kind in ("warm", "cold"):
        on_commit(session, TASK_STARTS.labels(kind=kind).inc)


def observe_heartbeat_round_trip(milliseconds: int) -> None:
    """An agent's measured round trip of its previous heartbeat; 0 (none measured yet) is skipped."""
    if milliseconds > 0:
        HEARTBEAT_ROUND_TRIP.observe(milliseconds / 1000.0)


def observe_loop_lag(seconds: float) -> None:
    """How late one of the event loop's timers fired (server/live/loop_lag.py)."""
    EVENT_LOOP_LAG.observe(seconds)


def count_ingested(lines: int, points: int) -> None:
    """Items of one committed telemetry transaction."""
    if lines:
        LOG_LINES_INGESTED.inc(lines)
    if points:
        METRIC_POINTS_INGESTED.inc(points)


def observe_scheduler_pass(seconds: float) -> None:
    """One scheduler pass's own time."""
    SCHEDULER_PASS.observe(max(0.0, seconds))


def count_command(kind: str) -> None:
    """One command (start, stop) sent to an agent; commands are few, so one increment each."""
    AGENT_COMMANDS.labels(kind=kind).inc()
