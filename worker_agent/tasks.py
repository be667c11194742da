"""The tasks this agent process knows: starting, running and stopping them, and what to report about them.

Every state change becomes a TaskReport on `reports` (the session sends them); log lines and metric points
wait in each task's outboxes until the coordinator acknowledges them. A task is forgotten once its final
state and all its logs and metrics are acknowledged.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from pathlib import Path

from mwms.archive import ArchiveError, extract_archive
from mwms.v1 import agent_pb2, agent_pb2_grpc
from worker_agent import artifacts
from worker_agent.bundles import BundleCache, BundleError
from worker_agent.metrics import MetricsTail
from worker_agent.outbox import Outbox
from worker_agent.runner import TaskProcess, describe_exit
from worker_agent.task_env import TaskPaths, child_environment, resolve_command

log = logging.getLogger("mwms.agent.tasks")

State = agent_pb2.TaskState
TERMINAL_STATES = frozenset(
    {agent_pb2.TASK_STATE_SUCCEEDED, agent_pb2.TASK_STATE_FAILED, agent_pb2.TASK_STATE_STOPPED}
    | {agent_pb2.TASK_STATE_REJECTED}
)
METRICS_POLL_SECONDS = 0.5


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

    def __init__(self, start: agent_pb2.StartTask, paths: TaskPaths) -> None:
        self.start = start
        self.paths = paths
        self.report = agent_pb2.TaskReport(task_id=start.task_id, state=agent_pb2.TASK_STATE_STARTING)
        self.logs: Outbox[agent_pb2.LogLine] = Outbox()
        self.metrics: Outbox[agent_pb2.MetricPoint] = Outbox()
        self.process: TaskProcess | None = None
        self.stop_reason: str | None = None
        self.final_acked = False
        self.lock = threading.RLock()
        self._log_seq = 0
        self._log_seq_lock = threading.Lock()

    @property
    def task_id(self) -> str:
        return self.start.task_id

    @property
    def ended(self) -> bool:
        return self.report.state in TERMINAL_STATES

    def add_log(self, stream: str, text: str) -> None:
        """Appends a line to the task's logs with the next seq (shared by stdout, stderr and agent notes)."""
        with self._log_seq_lock:
            self._log_seq += 1
            line = agent_pb2.LogLine(
                seq=self._log_seq, stream=stream, text=text, unix_ms=int(time.time() * 1000)
            )
            self.logs.add(line)


class TaskManager:
    """Starts and stops tasks on StartTask/StopTask, keeps their reports, logs and metrics until acked."""

    def __init__(
        self,
        work_dir: Path,
        stub: agent_pb2_grpc.AgentServiceStub,
        hostname: str,
        default_grace_seconds: float = 10.0,
    ) -> None:
        self._work_dir = work_dir
        self._stub = stub
        self._hostname = hostname
        self._default_grace = default_grace_seconds
        self._bundles = BundleCache(work_dir / "bundles", stub)
        self._records: dict[str, TaskRecord] = {}
        self._records_lock = threading.Lock()
        # Reports waiting to be sent; `reports_ready` wakes the session's sender.
        self.reports: queue.Queue[agent_pb2.TaskReport] = queue.Queue()
        self.reports_ready = threading.Event()

    def records(self) -> list[TaskRecord]:
        """The tasks known now (running, or ended and not yet fully acknowledged)."""
        with self._records_lock:
            return list(self._records.values())

    def current_reports(self) -> list[agent_pb2.TaskReport]:
        """The latest report of every known task (for Hello)."""
        reports = []
        for record in self.records():
            with record.lock:
                report = agent_pb2.TaskReport()
                report.CopyFrom(record.report)
                reports.append(report)
        return reports

    def start(self, start: agent_pb2.StartTask) -> None:
        """Starts the task in a worker thread; a start for a known task only re-sends its report."""
        with self._records_lock:
            record = self._records.get(start.task_id)
            if record is None:
                record = TaskRecord(start, TaskPaths.for_task(self._work_dir, start))
                self._records[start.task_id] = record
                is_new = True
            else:
                is_new = False
        if not is_new:
            with record.lock:
                self._send(record.report)
            return
        log.info("starting task %s (job %s, index %d)", start.task_id, start.job_id, start.task_index)
        self._publish(record, agent_pb2.TASK_STATE_STARTING)
        threading.Thread(
            target=self._start_task, args=(record,), name=f"start-{start.task_id}", daemon=True
        ).start()

    def stop(self, stop: agent_pb2.StopTask) -> None:
        """Stops the task (SIGTERM, then SIGKILL after the grace) in a worker thread."""
        record = self._get(stop.task_id)
        if record is None:
            self._send(
                agent_pb2.TaskReport(
                    task_id=stop.task_id,
                    state=agent_pb2.TASK_STATE_STOPPED,
                    message="not running on this agent",
                )
            )
            return
        reason = stop.reason or "stopped by the coordinator"
        with record.lock:
            if record.ended:
                self._send(record.report)
                return
            if record.stop_reason is None:
                record.stop_reason = reason
            process = record.process
            if process is None:
                # Still starting: the start thread sees the ended state and spawns nothing.
                self._publish(record, agent_pb2.TASK_STATE_STOPPED, message=reason)
                return
        grace = stop.grace_seconds or record.start.stop_grace_seconds or self._default_grace
        threading.Thread(
            target=process.terminate, args=(grace,), name=f"stop-{stop.task_id}", daemon=True
        ).start()

    def stop_all(self, grace_seconds: float, reason: str = "the agent is shutting down") -> None:
        """Stops every running task at once and waits until all of them have ended."""
        waiting = []
        for record in self.records():
            with record.lock:
                if record.ended:
                    continue
                if record.stop_reason is None:
                    record.stop_reason = reason
                process = record.process
                if process is None:
                    self._publish(record, agent_pb2.TASK_STATE_STOPPED, message=reason)
                    continue
            waiting.append(record)
            threading.Thread(target=process.terminate, args=(grace_seconds,), daemon=True).start()
        deadline = time.monotonic() + grace_seconds + 15.0
        while any(not record.ended for record in waiting) and time.monotonic() < deadline:
            time.sleep(0.05)

    def ack(self, ack: agent_pb2.Ack) -> None:
        """Trims the task's outboxes; forgets the task once its final state and all items are stored."""
        record = self._get(ack.task_id)
        if record is None:
            return
        record.logs.ack(ack.log_seq)
        record.metrics.ack(ack.metric_seq)
        with record.lock:
            if ack.final_state and record.ended:
                record.final_acked = True
            done = (
                record.final_acked
                and not record.logs.unacked(limit=1)
                and not record.metrics.unacked(limit=1)
            )
        if done:
            with self._records_lock:
                self._records.pop(ack.task_id, None)
            log.info("task %s is fully acknowledged; forgetting it", ack.task_id)

    def _get(self, task_id: str) -> TaskRecord | None:
        with self._records_lock:
            return self._records.get(task_id)

    def _send(self, report: agent_pb2.TaskReport) -> None:
        copy = agent_pb2.TaskReport()
        copy.CopyFrom(report)
        self.reports.put(copy)
        self.reports_ready.set()

    def _publish(
        self,
        record: TaskRecord,
        state: State.ValueType,
        *,
        message: str = "",
        exit_code: int = 0,
        pid: int = 0,
    ) -> bool:
        """Moves the task to `state` and queues the report; an ended task never changes again."""
        with record.lock:
            if record.ended:
                return False
            record.report = agent_pb2.TaskReport(
                task_id=record.task_id, state=state, message=message, exit_code=exit_code, pid=pid
            )
            self._send(record.report)
            return True

    def _reject(self, record: TaskRecord, message: str) -> None:
        log.warning("task %s rejected: %s", record.task_id, message)
        self._publish(record, agent_pb2.TASK_STATE_REJECTED, message=message)

    def _start_task(self, record: TaskRecord) -> None:
        start = record.start
        try:
            if start.port and not port_is_free(start.port):
                self._reject(
                    record,
                    f"port {start.port} is already in use on host {self._hostname}; "
                    "the coordinator will place the job again",
                )
                return
            command = resolve_command(list(start.command))
            if not command:
                self._reject(record, "the task has an empty command")
                return
            archive = self._bundles.get(start.bundle_digest) if start.bundle_digest else None
            if record.ended:
                return
            record.paths.create_fresh()
            if archive is not None:
                extract_archive(archive, record.paths.bundle_dir)
            env = child_environment(start, record.paths, os.environ)
            self._spawn(record, command, env)
        except (BundleError, ArchiveError) as error:
            self._reject(record, str(error))
        except OSError as error:
            self._reject(record, f"could not start {start.command[0] if start.command else ''!r}: {error}")
        except Exception as error:  # noqa: BLE001 - the coordinator must hear about any failed start
            log.exception("task %s failed to start", record.task_id)
            self._reject(record, f"the agent failed to start the task: {error}")

    def _spawn(self, record: TaskRecord, command: list[str], env: dict[str, str]) -> None:
        metrics_done = threading.Event()
        tail = MetricsTail(record.paths.metrics_file)

        def on_exit(exit_code: int) -> None:
            metrics_done.set()
            metrics_thread.join()
            self._task_exited(record, exit_code, tail)

        process = TaskProcess(command, env, record.paths.bundle_dir, record.add_log, on_exit)
        metrics_thread = threading.Thread(
            target=self._tail_metrics,
            args=(record, tail, metrics_done),
            name=f"metrics-{record.task_id}",
            daemon=True,
        )
        # Held across spawn and the RUNNING report, so a fast exit cannot report before RUNNING.
        with record.lock:
            if record.ended:
                return
            metrics_thread.start()
            pid = process.start()
            record.process = process
            self._publish(record, agent_pb2.TASK_STATE_RUNNING, pid=pid)
        log.info("task %s running as pid %d", record.task_id, pid)

    def _tail_metrics(self, record: TaskRecord, tail: MetricsTail, done: threading.Event) -> None:
        while not done.wait(METRICS_POLL_SECONDS):
            self._poll_metrics(record, tail)

    @staticmethod
    def _poll_metrics(record: TaskRecord, tail: MetricsTail) -> None:
        points, warnings = tail.poll()
        for warning in warnings:
            record.add_log("stderr", warning)
        for point in points:
            record.metrics.add(point)

    def _task_exited(self, record: TaskRecord, exit_code: int, tail: MetricsTail) -> None:
        self._poll_metrics(record, tail)
        if record.stop_reason is not None:
            state, message = agent_pb2.TASK_STATE_STOPPED, record.stop_reason
        elif exit_code == 0:
            state, message = agent_pb2.TASK_STATE_SUCCEEDED, describe_exit(0)
        else:
            state, message = agent_pb2.TASK_STATE_FAILED, describe_exit(exit_code)
        if record.start.task_index == 0:
            self._upload_artifacts(record)
        log.info("task %s ended: %s", record.task_id, message)
        pid = record.process.pid if record.process else 0
        self._publish(record, state, message=message, exit_code=exit_code, pid=pid)

    def _upload_artifacts(self, record: TaskRecord) -> None:
        output = record.paths.output_dir
        if not artifacts.directory_has_files(output):
            return
        archive = record.paths.task_dir / "artifacts.tar.gz"
        try:
            artifacts.pack_directory(output, archive)
            response = artifacts.upload_archive(
                self._stub, record.task_id, agent_pb2.FILE_KIND_ARTIFACTS, archive
            )
            log.info("uploaded artifacts of task %s (%d bytes)", record.task_id, response.size)
        except Exception as error:  # noqa: BLE001 - a failed upload must not hide the task's final state
            log.warning("could not upload the artifacts of task %s: %s", record.task_id, error)
            record.add_log("stderr", f"mwms-agent: could not upload the artifacts: {error}")
        finally:
            archive.unlink(missing_ok=True)
