"""The tasks this agent process knows: starting, running and stopping them, and what to report about them.

Every state change becomes a TaskReport on `reports` (the connection sends them) and is written to the task
table on disk (`agent-state.json`); log lines and metric points wait in each task's on-disk outboxes
(`outbox/<task_id>/`) until the coordinator acknowledges them. A task is forgotten once its final state and
all its logs and metrics are acknowledged.

After an agent restart, `recover()` stops the process groups the previous agent process left behind and
turns every recorded task into an ended record, so the first Hello reports it and its unacknowledged
lines are sent again. The agent runs it in the background (`recover_in_background`): stopping a task that
ignores SIGTERM takes the whole stop grace, and meanwhile the agent's stream beats, so the coordinator
never takes a restarted agent for a lost one; its Hello waits for `recovered`.

The TaskManager holds the task table and decides; a `TaskRuns` (worker_agent/task_runs.py) brings each
task up in its start thread and reports its end, a `TaskWorkspace` (worker_agent/task_workspace.py) handles
its files (bundle, checkpoint restore, artifacts, the job's environment) and a `TaskProcesses`
(worker_agent/task_processes.py) its processes (confinement, spawn, exit, limits, stop).
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from mwms.agent_defaults import ENV_CACHE_BYTES
from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent import agent_state
from mwms.worker_agent.agent_state import AgentStateFile
from mwms.worker_agent.cgroups import TaskCgroups
from mwms.worker_agent.environments import EnvironmentCache
from mwms.worker_agent.gpu_nodes import GpuNode
from mwms.worker_agent.metrics import MetricsTail
from mwms.worker_agent.port_guard import PortGuard
from mwms.worker_agent.sandbox import Confinement
from mwms.worker_agent.task_env import TaskPaths
from mwms.worker_agent.task_limits import LimitPolicy
from mwms.worker_agent.task_processes import TaskProcessArgs, TaskProcesses, terminate_in_background
from mwms.worker_agent.task_record import TERMINAL_STATES, State, TaskRecord, recovered_outcome
from mwms.worker_agent.task_runs import TaskRuns
from mwms.worker_agent.task_users import TaskUsers
from mwms.worker_agent.task_workspace import TaskWorkspace
from mwms.worker_agent.warm_pool import WarmPool

log = logging.getLogger("mwms.agent.tasks")


class TaskManager:
    """Starts and stops tasks on StartTask/StopTask, keeps their reports, logs and metrics until acked."""

    def __init__(
        self,
        work_dir: Path,
        stub: agent_pb2_grpc.AgentServiceStub,
        hostname: str,
        default_grace_seconds: float = 10.0,
        confinement: Confinement | None = None,
        environments: EnvironmentCache | None = None,
        gpus: Mapping[int, GpuNode] | None = None,
        cgroups: TaskCgroups | None = None,
        limits: LimitPolicy | None = None,
        port_guard: PortGuard | None = None,
        scope_sockets: bool = False,
        warm_pool: WarmPool | None = None,
    ) -> None:
        self._work_dir = work_dir
        # Without a confinement (tests of the bookkeeping): tasks run unconfined as the agent's own user.
        self._processes = TaskProcesses(
            work_dir,
            confinement or Confinement(work_dir, TaskUsers.agents_own(), None),
            gpus or {},
            cgroups,
            limits,
            port_guard,
            scope_sockets,
            default_grace_seconds,
        )
        self._default_grace = default_grace_seconds
        self._outbox_root = work_dir / "outbox"
        self._state = AgentStateFile(work_dir / "agent-state.json")
        self._state_lock = threading.Lock()
        self._records: dict[str, TaskRecord] = {}
        self._records_lock = threading.Lock()
        # Bundles, checkpoints, artifacts and environments; its owners of task dirs share the records' lock.
        self._workspace = TaskWorkspace(
            work_dir,
            stub,
            environments or EnvironmentCache(work_dir / "envs", ENV_CACHE_BYTES),
            self._records_lock,
        )
        # Warm interpreters (worker_agent/warm_pool.py), started once a recovery has reclaimed what an
        # earlier agent process held.
        self.warm_pool = warm_pool
        self._runs = TaskRuns(
            hostname, self._workspace, self._processes, self._publish, self._preflight_done, self.warm_pool
        )
        # Reports waiting to be sent; `reports_ready` wakes the connection's sender.
        self.reports: queue.Queue[agent_pb2.TaskReport] = queue.Queue()
        self.reports_ready = threading.Event()
        # Preflight results waiting to be sent (before the reports taken with them; not resent after a
        # reconnect: the task's report carries a failed check's message all the same).
        self.preflight_results: queue.Queue[agent_pb2.PreflightResult] = queue.Queue()
        # Set while no recovery is under way: a Hello (and so any command) waits for it.
        self.recovered = threading.Event()
        self.recovered.set()

    def use_stub(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        """Uses `stub` (a new channel) for bundle fetches, uploads and checkpoint restores from now on."""
        self._workspace.use_stub(stub)

    def records(self) -> list[TaskRecord]:
        """The tasks known now (running, or ended and not yet fully acknowledged)."""
        with self._records_lock:
            return list(self._records.values())

    def hello_reports(self) -> tuple[list[agent_pb2.TaskReport], list[agent_pb2.TaskReport]]:
        """(reports for a Hello, final reports to send after the resent lines).

        Every known task whose final state is not acknowledged yet is listed. A task that ended while its
        last log lines are still unsent is listed as RUNNING, and its final report follows those lines:
        the coordinator builds a failure's reason from the task's last lines when the report arrives.
        """
        hello, deferred = [], []
        for record in self.records():
            with record.lock:
                if record.final_acked:
                    continue
                report = agent_pb2.TaskReport()
                report.CopyFrom(record.report)
                if record.ended and record.pid and record.logs.unacked(limit=1):
                    deferred.append(report)
                    report = agent_pb2.TaskReport(
                        task_id=record.task_id, state=agent_pb2.TASK_STATE_RUNNING, pid=record.pid
                    )
                hello.append(report)
        return hello, deferred

    def start(self, start: agent_pb2.StartTask) -> None:
        """Starts the task in a worker thread; a start for a known task only re-sends its report."""
        with self._records_lock:
            record = self._records.get(start.task_id)
            if record is None:
                outbox_dir = self._outbox_root / start.task_id
                record = TaskRecord(start, TaskPaths.for_task(self._work_dir, start), outbox_dir)
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
            target=self._runs.start, args=(record,), name=f"start-{start.task_id}", daemon=True
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
        terminate_in_background(process, grace, name=f"stop-{stop.task_id}")

    def stop_all(self, grace_seconds: float, reason: str = "the agent is shutting down") -> None:
        """Stops every running task at once and waits until all of them have ended."""
        # What a recovery under way is stopping gets its grace there; the table then says how it ended.
        self.recovered.wait(grace_seconds + agent_state.KILL_WAIT_S)
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
            terminate_in_background(process, grace_seconds)
        if self.warm_pool is not None:
            self.warm_pool.close()
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
        if ack.rejected:
            # Refused as invalid: acknowledged all the same, so dropped here and never sent again.
            kind = "metric point(s)" if ack.metric_seq else "log line(s)"
            log.warning(
                "task %s: the coordinator refused %d %s: %s",
                record.task_id,
                ack.rejected,
                kind,
                ack.reject_reason,
            )
            if ack.metric_seq:
                record.add_log(
                    "stderr",
                    f"mwms-agent: the coordinator refused {ack.rejected} {kind}: {ack.reject_reason}",
                )
        newly_final = False
        with record.lock:
            if ack.final_state and record.ended and not record.final_acked:
                record.final_acked = newly_final = True
            done = record.final_acked and not record.logs and not record.metrics
        if done:
            self._forget(record)
        elif newly_final:
            self._persist()

    def recover_in_background(self, grace_seconds: float) -> None:
        """Runs `recover` in a thread; `recovered` is set once it is done, however it ended."""
        self.recovered.clear()

        def run() -> None:
            try:
                self.recover(grace_seconds)
            except Exception:
                log.exception("could not take over the tasks of the previous agent process")
            finally:
                self.recovered.set()
            if self.warm_pool is not None:
                self.warm_pool.start()

        threading.Thread(target=run, name="recover", daemon=True).start()

    def recover(self, grace_seconds: float) -> int:
        """Takes over the tasks a previous agent process on this work dir left; returns how many.

        Process groups still alive are stopped (SIGTERM, SIGKILL after `grace_seconds`): nothing can read
        their output any more. Each task becomes an ended record whose final state the next Hello reports
        and whose unacknowledged log lines and metric points are sent again.
        """
        entries = self._state.load()
        stopped = self._processes.take_over(entries, grace_seconds)
        for entry in entries:
            start = agent_pb2.StartTask(
                task_id=entry.task_id, job_id=entry.job_id, attempt=entry.attempt, task_index=entry.task_index
            )
            paths = TaskPaths.for_task(self._work_dir, start)
            if entry.task_dir:  # a warm start's (worker_agent/warm_pool.py)
                paths = TaskPaths.at(Path(entry.task_dir), paths.scratch_dir)
            record = TaskRecord(start, paths, self._outbox_root / entry.task_id)
            record.pid, record.start_ticks, record.final_acked = (
                entry.pid,
                entry.start_ticks,
                entry.final_acked,
            )
            state, exit_code, message = recovered_outcome(entry, entry.task_id in stopped)
            record.report = agent_pb2.TaskReport(
                task_id=entry.task_id, state=state, exit_code=exit_code, message=message, pid=entry.pid
            )
            if entry.state not in TERMINAL_STATES:
                record.add_log("stderr", f"mwms-agent: {message}")
            # Metric lines written after the dead agent's last poll; points already stored are ignored.
            self._drain_metrics(record)
            with self._records_lock:
                self._records[entry.task_id] = record
            if record.final_acked and not record.logs and not record.metrics:
                self._forget(record)
        if entries:
            log.info("took over %d task(s) from the previous agent process", len(entries))
        self._persist()
        return len(entries)

    @staticmethod
    def _drain_metrics(record: TaskRecord) -> None:
        tail = MetricsTail(record.paths.metrics_file)
        while True:
            points, warnings = tail.poll()
            if not points and not warnings:
                return
            for point in points:
                record.add_metric(point)

    def _forget(self, record: TaskRecord) -> None:
        with self._records_lock:
            self._records.pop(record.task_id, None)
        record.logs.close()
        record.metrics.close()
        shutil.rmtree(record.outbox_dir, ignore_errors=True)
        # Its artifacts and checkpoints went to the coordinator before its final report: nothing of the
        # task stays on this machine for the next job's user to find.
        self._workspace.remove(record)
        self._persist()
        log.info("task %s is fully acknowledged; forgetting it", record.task_id)

    def _persist(self) -> None:
        """Writes the task table; serialized, so the file always ends with the latest snapshot."""
        with self._state_lock:
            entries = [record.entry() for record in self.records()]
            try:
                self._state.save(entries)
            except OSError as error:
                log.warning("could not write the task table %s: %s", self._state.path, error)

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
        environment: agent_pb2.EnvironmentStatus.ValueType = agent_pb2.ENVIRONMENT_STATUS_UNSPECIFIED,
        environment_build_seconds: float = 0.0,
        environment_digest: str = "",
        environment_platform: str = "",
        start_kind: agent_pb2.StartKind.ValueType = agent_pb2.START_KIND_UNSPECIFIED,
    ) -> bool:
        """Moves the task to `state` and queues the report; an ended task never changes again."""
        with record.lock:
            if record.ended:
                return False
            record.report = agent_pb2.TaskReport(
                task_id=record.task_id,
                state=state,
                message=message,
                exit_code=exit_code,
                pid=pid,
                environment=environment,
                environment_build_seconds=environment_build_seconds,
                environment_digest=environment_digest,
                environment_platform=environment_platform,
                start_kind=start_kind,
            )
            if record.cgroup is not None:
                record.report.memory_limit_bytes = record.cgroup.limits.memory_bytes
                if state not in TERMINAL_STATES:
                    record.peak_memory = max(record.peak_memory, record.cgroup.peak_memory())
            record.report.peak_memory_bytes = record.peak_memory
            self._send(record.report)
        self._persist()
        return True

    def launch_for(self, record: TaskRecord, command: list[str]) -> TaskProcessArgs:
        """The argv and identity switch that run `command` confined as the task's user."""
        return self._processes.launch_for(record, command)

    def _preflight_done(self, result: agent_pb2.PreflightResult) -> None:
        self.preflight_results.put(result)
        self.reports_ready.set()

    def drain_preflight_results(self) -> list[agent_pb2.PreflightResult]:
        """The preflight results not sent yet, oldest first."""
        results = []
        while True:
            try:
                results.append(self.preflight_results.get_nowait())
            except queue.Empty:
                return results
