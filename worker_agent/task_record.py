"""One task as the agent tracks it (TaskRecord), and the outcomes it reports after an agent restart."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent import agent_state
from mwms.worker_agent.agent_state import TaskEntry
from mwms.worker_agent.cgroups import TaskCgroup
from mwms.worker_agent.environments import Environment
from mwms.worker_agent.import_failures import missing_module
from mwms.worker_agent.job_shares import JobShare
from mwms.worker_agent.outbox import Outbox
from mwms.worker_agent.runner import TaskProcess
from mwms.worker_agent.task_env import TaskPaths
from mwms.worker_agent.task_users import TaskIdentity

State = agent_pb2.TaskState
TERMINAL_STATES = frozenset(
    {agent_pb2.TASK_STATE_SUCCEEDED, agent_pb2.TASK_STATE_FAILED, agent_pb2.TASK_STATE_STOPPED}
    | {agent_pb2.TASK_STATE_REJECTED}
)
RESTARTED_WHILE_RUNNING = "the agent restarted while this task was running; its process was stopped"
RESTARTED_AFTER_EXIT = (
    "the agent restarted while this task was running; its process had already ended (exit code unknown)"
)
RESTARTED_BEFORE_SPAWN = "the agent restarted before the task's process was started"
# Exit code reported when the process ended while no agent watched it.
UNKNOWN_EXIT_CODE = -1


def recovered_outcome(entry: TaskEntry, stopped_now: bool) -> tuple[State.ValueType, int, str]:
    """(state, exit code, message) to report for a task found in the table of a previous agent process."""
    if entry.state in TERMINAL_STATES:
        return State.ValueType(entry.state), entry.exit_code, entry.message
    if entry.pid == 0:
        return agent_pb2.TASK_STATE_REJECTED, 0, RESTARTED_BEFORE_SPAWN
    if stopped_now:
        return agent_pb2.TASK_STATE_FAILED, 137, RESTARTED_WHILE_RUNNING
    return agent_pb2.TASK_STATE_FAILED, UNKNOWN_EXIT_CODE, RESTARTED_AFTER_EXIT


def port_is_free(port: int) -> bool:
    """True when a socket can bind `port` on all interfaces right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # A port left in TIME_WAIT by an earlier attempt is usable again; a listening one is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


class TaskRecord:
    """One task: its start command, current report, outboxes and (once spawned) its process."""

    def __init__(self, start: agent_pb2.StartTask, paths: TaskPaths, outbox_dir: Path) -> None:
        self.start = start
        self.paths = paths
        self.outbox_dir = outbox_dir
        self.report = agent_pb2.TaskReport(task_id=start.task_id, state=agent_pb2.TASK_STATE_STARTING)
        self.logs: Outbox[agent_pb2.LogLine] = Outbox(outbox_dir, "logs", agent_pb2.LogLine)
        self.metrics: Outbox[agent_pb2.MetricPoint] = Outbox(outbox_dir, "metrics", agent_pb2.MetricPoint)
        self.process: TaskProcess | None = None
        self.pid = 0
        self.start_ticks = 0
        # Who the task's processes run as (worker_agent/task_users.py), from its start until it ends.
        self.identity: TaskIdentity | None = None
        # The job's own Python environment the task holds (worker_agent/environments.py), if it has one.
        self.environment: Environment | None = None
        # The /dev/shm and IPC namespace it shares with its job's other tasks here (worker_agent/job_shares.py).
        self.share: JobShare | None = None
        self.stop_reason: str | None = None
        # Its own cgroup (worker_agent/cgroups.py), from before it starts until it has ended; the most
        # memory it held, read when it ended; why the agent ended it for breaking a limit (a FAILED reason).
        self.cgroup: TaskCgroup | None = None
        self.peak_memory = 0
        self.limit_breach: str | None = None
        # The module of the last ModuleNotFoundError the task's own output reported (import_failures.py).
        self.missing_module: str | None = None
        self.final_acked = False
        self.lock = threading.RLock()
        # Continues after every seq a previous agent process used for this task.
        self._log_seq = self.logs.last_seq
        self._log_seq_lock = threading.Lock()
        # Per stream: the seq of its last line when that line came from the task's output (a redraw of it
        # replaces it), 0 when an agent's note came last.
        self._redrawable: dict[str, int] = {}

    @property
    def task_id(self) -> str:
        return self.start.task_id

    @property
    def ended(self) -> bool:
        return self.report.state in TERMINAL_STATES

    def add_log(self, stream: str, text: str, redraw: bool | None = None) -> None:
        """Appends a line to the task's logs with the next seq (shared by stdout, stderr and agent notes).

        `redraw` comes from the task's output reader (TaskProcess's on_output): True when the line is a
        newer state of the line before it from that stream (a `\\r` redraw), which it then replaces
        (LogLine.replaces_seq). An agent's note passes none; a redraw after a note is a line of its own,
        so the note is never replaced.
        """
        if redraw is not None and stream == "stderr" and text.startswith("ModuleNotFoundError"):
            self.missing_module = missing_module(text) or self.missing_module
        with self._log_seq_lock:
            self._log_seq += 1
            replaces = self._redrawable.get(stream, 0) if redraw else 0
            line = agent_pb2.LogLine(
                seq=self._log_seq,
                stream=stream,
                text=text,
                unix_ms=int(time.time() * 1000),
                replaces_seq=replaces,
            )
            self._redrawable[stream] = self._log_seq if redraw is not None else 0
            dropped = self.logs.add(line)
        if dropped:
            self.add_log(
                "stderr",
                f"mwms-agent: the coordinator was unreachable too long; dropped the {dropped} oldest "
                f"unsent log lines ({self.logs.dropped} in all)",
            )

    def add_metric(self, point: agent_pb2.MetricPoint) -> None:
        """Keeps a metric point until acknowledged (its seq is its line in the metrics file)."""
        dropped = self.metrics.add(point)
        if dropped:
            self.add_log(
                "stderr",
                f"mwms-agent: the coordinator was unreachable too long; dropped the {dropped} oldest "
                f"unsent metric points ({self.metrics.dropped} in all)",
            )

    def entry(self) -> TaskEntry:
        """The task's row in the on-disk task table."""
        report = self.report
        return TaskEntry(
            task_id=self.task_id,
            job_id=self.start.job_id,
            attempt=self.start.attempt,
            task_index=self.start.task_index,
            state=report.state,
            pid=self.pid,
            pgid=self.pid,  # spawned with start_new_session: the group id is the pid
            start_ticks=self.start_ticks,
            boot_id=agent_state.boot_id() if self.pid else "",
            exit_code=report.exit_code,
            message=report.message,
            final_acked=self.final_acked,
            uid=self.identity.uid if self.identity is not None and not self.identity.shared else 0,
            task_dir=str(self.paths.task_dir),
        )
