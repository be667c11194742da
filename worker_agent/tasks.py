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
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mwms import task_environment
from mwms.agent_defaults import ENV_CACHE_BYTES
from mwms.archive import ArchiveError, extract_archive
from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent import agent_state, artifacts, checkpoints, import_failures, preflight
from mwms.worker_agent.agent_state import AgentStateFile
from mwms.worker_agent.bundles import BundleCache, BundleError
from mwms.worker_agent.cgroups import CgroupError, TaskCgroups
from mwms.worker_agent.checkpoints import CheckpointWatcher, RestoreError
from mwms.worker_agent.environments import (
    Environment,
    EnvironmentBuildError,
    EnvironmentCache,
    EnvironmentSpec,
)
from mwms.worker_agent.gpu_nodes import GpuNode
from mwms.worker_agent.job_shares import JobShares
from mwms.worker_agent.landlock import has_co_located_peer
from mwms.worker_agent.metrics import MetricsTail
from mwms.worker_agent.port_guard import PortGuard, PortGuardError
from mwms.worker_agent.runner import (
    CommandNotRunnable,
    TaskProcess,
    check_runnable,
    describe_exit,
    spawn_refusal,
)
from mwms.worker_agent.sandbox import Confinement
from mwms.worker_agent.task_env import TaskPaths, child_environment, in_environment, resolve_command
from mwms.worker_agent.task_files import pack_beneath
from mwms.worker_agent.task_limits import LimitPolicy, disk_usage
from mwms.worker_agent.task_record import (
    TERMINAL_STATES,
    State,
    TaskRecord,
    port_is_free,
    recovered_outcome,
)
from mwms.worker_agent.task_users import TaskUserError, TaskUsers, end_processes_of

log = logging.getLogger("mwms.agent.tasks")


class UnknownGpu(Exception):
    """A task was given a GPU index this agent does not offer."""


# Keyword arguments of TaskProcess for the identity switch, and the confined argv.
TaskProcessArgs = tuple[dict[str, Any], list[str]]
METRICS_POLL_SECONDS = 0.5
# How often a task's files are measured against --task-disk-max.
DISK_POLL_SECONDS = 5.0


def environment_paths(environment: Environment) -> list[Path]:
    """What a task reads of its job's own environment: the venv, and the installation of the
    interpreter it was made from (which a sandbox may otherwise hide, e.g. under a closed /root)."""
    interpreter = Path(os.path.realpath(environment.python))
    return [environment.prefix, interpreter.parents[1]]


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
    ) -> None:
        self._work_dir = work_dir
        # Each task's cgroup and its limits (worker_agent/cgroups.py, task_limits.py); without cgroups
        # (an agent that is neither root nor delegated one) only the disk limit holds.
        self._cgroups = cgroups
        self._limits = limits
        # The rules on each task's ports (worker_agent/port_guard.py), on its cgroup.
        self._port_guard = port_guard
        # Host abstract unix sockets out of tasks' reach (worker_agent/landlock.py), where the kernel can.
        self._scope_sockets = scope_sockets
        # Without one (tests of the bookkeeping): tasks run unconfined as the agent's own user.
        self._confinement = confinement or Confinement(work_dir, TaskUsers.agents_own(), None)
        # The GPUs this agent offers by host index (worker_agent/gpu_nodes.py); none: tasks are told the
        # indices they were given alone.
        self._gpus = dict(gpus or {})
        self._shares = JobShares(work_dir)
        self._stub = stub
        self._hostname = hostname
        self._default_grace = default_grace_seconds
        self._bundles = BundleCache(work_dir / "bundles", stub)
        self._environments = environments or EnvironmentCache(work_dir / "envs", ENV_CACHE_BYTES)
        self._outbox_root = work_dir / "outbox"
        self._state = AgentStateFile(work_dir / "agent-state.json")
        self._state_lock = threading.Lock()
        self._records: dict[str, TaskRecord] = {}
        self._records_lock = threading.Lock()
        # Which task made each task dir: a task the coordinator placed again under the same job, attempt
        # and index gets the same dir, and the earlier record must not remove it when it is forgotten.
        self._dir_owners: dict[Path, str] = {}
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
        self._stub = stub
        self._bundles.use_stub(stub)

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

        threading.Thread(target=run, name="recover", daemon=True).start()

    def recover(self, grace_seconds: float) -> int:
        """Takes over the tasks a previous agent process on this work dir left; returns how many.

        Process groups still alive are stopped (SIGTERM, SIGKILL after `grace_seconds`): nothing can read
        their output any more. Each task becomes an ended record whose final state the next Hello reports
        and whose unacknowledged log lines and metric points are sent again.
        """
        entries = self._state.load()
        orphans = [e for e in entries if e.state not in TERMINAL_STATES and agent_state.owns_live_group(e)]
        if orphans:
            log.warning(
                "%d task process group(s) outlived the previous agent process; stopping them", len(orphans)
            )
            agent_state.stop_groups([e.pgid for e in orphans], grace_seconds)
        stopped = {e.task_id for e in orphans}
        self._reclaim_uids(entries)
        self._shares.clean_stale()  # their jobs' /dev/shm and IPC namespaces
        if self._cgroups is not None:
            self._cgroups.clean_stale()  # and their cgroups, with whatever still ran in them
        for entry in entries:
            start = agent_pb2.StartTask(
                task_id=entry.task_id, job_id=entry.job_id, attempt=entry.attempt, task_index=entry.task_index
            )
            paths = TaskPaths.for_task(self._work_dir, start)
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

    def _reclaim_uids(self, entries: list[agent_state.TaskEntry]) -> None:
        """Takes back the uids the previous agent process's tasks ran as (its locks died with it), ends
        what still runs as them, and gives them back: no uid passes on with a process of its last task."""
        users = self._confinement.users
        if not users.per_task:
            return
        for entry in entries:
            if not entry.uid or users.adopt(entry.task_id, entry.job_id, entry.uid) is None:
                continue  # someone else holds it now, so nothing of this task's runs as it
            if users.sole_holder(entry.task_id):
                end_processes_of(entry.uid)
            users.release(entry.task_id)

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
        self._remove_task_files(record)
        self._persist()
        log.info("task %s is fully acknowledged; forgetting it", record.task_id)

    def _remove_task_files(self, record: TaskRecord) -> None:
        paths = record.paths
        shutil.rmtree(paths.scratch_dir, ignore_errors=True)
        with self._records_lock:
            if self._dir_owners.get(paths.task_dir, record.task_id) != record.task_id:
                return  # made again by a later task of the same job, attempt and index
            self._dir_owners.pop(paths.task_dir, None)
        shutil.rmtree(paths.task_dir, ignore_errors=True)
        # The attempt's and the job's dirs go with their last task (rmdir fails while others remain).
        for parent in paths.task_dir.parents[:2]:
            try:
                parent.rmdir()
            except OSError:
                break

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
            )
            if record.cgroup is not None:
                record.report.memory_limit_bytes = record.cgroup.limits.memory_bytes
                if state not in TERMINAL_STATES:
                    record.peak_memory = max(record.peak_memory, record.cgroup.peak_memory())
            record.report.peak_memory_bytes = record.peak_memory
            self._send(record.report)
        self._persist()
        return True

    def _reject(self, record: TaskRecord, message: str) -> None:
        log.warning("task %s rejected: %s", record.task_id, message)
        self._publish(record, agent_pb2.TASK_STATE_REJECTED, message=message)

    def _start_task(self, record: TaskRecord) -> None:
        start = record.start
        command: list[str] = []
        shown = start.command[0] if start.command else ""
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
            gpus = self._gpus_of(start)
            identity = self._confinement.users.acquire(record.task_id, start.job_id)
            record.identity = identity
            if self._confinement.sandboxed:
                record.share = self._shares.acquire(start.job_id, record.task_id, identity.uid, identity.gid)
            if self._cgroups is not None and self._limits is not None:
                record.cgroup = self._cgroups.create(record.task_id, self._limits.limits(start))
                self._guard_ports(record)
            # Filled while only the agent can write there, then handed to the task's user.
            with self._records_lock:
                self._dir_owners[record.paths.task_dir] = record.task_id
            record.paths.create_fresh()
            if archive is not None:
                extract_archive(archive, record.paths.bundle_dir)
            if start.restore_checkpoint and not start.shared_checkpoint_dir:
                self._restore_checkpoint(record)
            if not identity.shared:
                record.paths.hand_over(identity.uid, identity.gid)
            if record.ended:
                self._release_identity(record)
                return
            environment = None
            if start.environment_lock:
                environment = self._build_environment(record)
                if environment is None:
                    self._release_identity(record)
                    return
                command = resolve_command(list(start.command), str(environment.python))
            env = child_environment(
                start,
                record.paths,
                os.environ,
                (identity.name, identity.shared),
                gpus=gpus,
                sandboxed=self._confinement.sandboxed,
            )
            if environment is not None:
                env = in_environment(env, environment.prefix)
            check_runnable(command[0], shown, env.get("PATH"), record.paths.bundle_dir)
            if start.preflight and not self._preflight_passed(record, env):
                self._release_identity(record)
                return
            self._spawn(record, command, env)
        except CommandNotRunnable as error:
            self._never_started(record, error)
        except (TaskUserError, UnknownGpu, CgroupError, PortGuardError) as error:
            self._reject(record, str(error))
        except (BundleError, ArchiveError) as error:
            self._reject(record, str(error))
        except OSError as error:
            refusal = spawn_refusal(error, command[0], shown) if command else None
            if refusal is not None:
                self._never_started(record, refusal)
            else:
                self._reject(record, f"could not start {shown!r}: {error}")
        except Exception as error:  # noqa: BLE001 - the coordinator must hear about any failed start
            log.exception("task %s failed to start", record.task_id)
            self._reject(record, f"the agent failed to start the task: {error}")
        if record.ended and record.process is None:
            self._release_identity(record)

    def _guard_ports(self, record: TaskRecord) -> None:
        """Puts the rules on the task's ports on its cgroup: it binds only its own port of the guarded
        ranges, and reaches them only at its job's peers."""
        bpf_dir = record.cgroup.bpf_dir if record.cgroup is not None else None
        if self._port_guard is None or bpf_dir is None:
            return
        start = record.start
        guarded = [(span.low, span.high) for span in start.guarded_ports]
        self._port_guard.attach(bpf_dir, self._port_guard.rules(start.port, guarded, start.tf_config))

    def _build_environment(self, record: TaskRecord) -> Environment | None:
        """The job's own Python environment, built with uv (or found in the cache) and held for the task;
        None when the task ended meanwhile or the build failed (reported: FAILED, never started, when no
        retry can help; REJECTED, placed again, when it can). Its lines go to the task's log."""
        start = record.start
        spec = EnvironmentSpec(
            locked=start.environment_lock,
            python=start.environment_python,
            isolated=start.environment_isolated,
        )
        self._publish(
            record,
            agent_pb2.TASK_STATE_STARTING,
            message="building the job's Python environment",
            environment=agent_pb2.ENVIRONMENT_STATUS_BUILDING,
        )
        record.add_log("stderr", f"mwms-agent: building environment {spec.key()[:12]} (uv)")
        try:
            environment = self._environments.acquire(spec, lambda line: record.add_log("stderr", line))
        except EnvironmentBuildError as error:
            log.warning("task %s: %s", record.task_id, error.message)
            record.add_log("stderr", f"mwms-agent: {error.message}")
            if error.retryable:
                self._reject(record, error.message)
            else:
                self._publish(
                    record,
                    agent_pb2.TASK_STATE_FAILED,
                    message=f"never started: {error.message}",
                    exit_code=task_environment.ENVIRONMENT_NOT_BUILT_EXIT_CODE,
                )
            return None
        record.environment = environment
        if record.ended:
            return None
        self._publish(
            record,
            agent_pb2.TASK_STATE_STARTING,
            message=f"environment ready ({f'built in {environment.build_seconds:.1f} s' if environment.built else 'from the cache'})",
            environment=agent_pb2.ENVIRONMENT_STATUS_READY,
            environment_build_seconds=environment.build_seconds,
            environment_digest=environment.digest,
            environment_platform=environment.platform,
        )
        return environment

    def _never_started(self, record: TaskRecord, error: CommandNotRunnable) -> None:
        """The command cannot be executed: FAILED with a shell's exit code and no pid, which the
        coordinator reads as "never started, not retryable" (mwms/task_environment.py)."""
        log.warning("task %s cannot start: %s", record.task_id, error)
        self._publish(
            record, agent_pb2.TASK_STATE_FAILED, message=f"never started: {error}", exit_code=error.exit_code
        )

    def launch_for(self, record: TaskRecord, command: list[str]) -> TaskProcessArgs:
        """The argv and identity switch that run `command` confined as the task's user."""
        identity = record.identity
        assert identity is not None, "the task has no identity yet"
        gpus = self._gpus_of(record.start) if self._confinement.sandboxed else []
        readable = [] if record.environment is None else environment_paths(record.environment)
        scope = self._scope_sockets and not has_co_located_peer(
            record.start.tf_config, record.start.task_index
        )
        launch = self._confinement.launch(
            command, record.paths, identity, gpus, readable, record.share, record.cgroup, scope
        )
        return {"user": launch.user, "group": launch.group, "spare_leader": launch.spare_leader}, launch.argv

    def _release_identity(self, record: TaskRecord) -> None:
        """Gives the task's uid back, once no process of it can be left (ended with its sandbox, or ended
        here: a uid of its own is the task's alone, so whatever still runs as it was the task's), and its
        hold on its environment (which the cache may then evict)."""
        if record.environment is not None:
            self._environments.release(record.environment)
            record.environment = None
        if record.share is not None:
            self._shares.release(record.share.job_id, record.task_id)
            record.share = None
        if record.cgroup is not None:
            record.peak_memory = max(record.peak_memory, record.cgroup.peak_memory())
            record.cgroup.remove()  # with whatever of the task still ran in it
            record.cgroup = None
        identity = record.identity
        if identity is None:
            return
        users = self._confinement.users
        if not identity.shared and users.per_task and users.sole_holder(record.task_id):
            # Not while the job's other tasks here run as it.
            if not self._confinement.sandboxed:
                end_processes_of(identity.uid)
            # The uid may pass to another job (of any agent here) before the task dir is removed.
            try:
                os.chown(record.paths.task_dir, 0, 0, follow_symlinks=False)
                os.chmod(record.paths.task_dir, 0o700, follow_symlinks=False)
            except OSError:
                pass
        users.release(record.task_id)

    def _gpus_of(self, start: agent_pb2.StartTask) -> list[GpuNode]:
        """The GPUs of a GPU task, in its order; [] for a CPU task or an agent that knows no GPU table."""
        if start.device_kind != agent_pb2.DEVICE_KIND_GPU or not self._gpus:
            return []
        unknown = [i for i in start.device_indices if i not in self._gpus]
        if unknown:
            raise UnknownGpu(
                f"this agent offers no GPU {', '.join(map(str, unknown))} (it offers "
                f"{', '.join(map(str, sorted(self._gpus)))}); the coordinator will place the job again"
            )
        return [self._gpus[i] for i in start.device_indices]

    def _preflight_passed(self, record: TaskRecord, env: dict[str, str]) -> bool:
        """Runs the gang's preflight check (worker_agent/preflight.py); False when the task ended instead."""
        outcome = preflight.run_check(record, env, lambda command: self.launch_for(record, command))
        if outcome.stopped:
            self._publish(record, agent_pb2.TASK_STATE_STOPPED, message=record.stop_reason or "stopped")
            return False
        self.preflight_results.put(outcome.result(record.task_id))
        self.reports_ready.set()
        if outcome.ok:
            return True
        log.warning("task %s: %s", record.task_id, preflight.failure_message(outcome))
        self._publish(
            record,
            agent_pb2.TASK_STATE_FAILED,
            message=preflight.failure_message(outcome),
            exit_code=outcome.exit_code,
            pid=record.pid,
        )
        return False

    def drain_preflight_results(self) -> list[agent_pb2.PreflightResult]:
        """The preflight results not sent yet, oldest first."""
        results = []
        while True:
            try:
                results.append(self.preflight_results.get_nowait())
            except queue.Empty:
                return results

    def _restore_checkpoint(self, record: TaskRecord) -> None:
        """Installs the job's latest checkpoint archive into the task's own checkpoint dir (each task has
        its own, owned by its user); a failure is only noted."""
        try:
            size = checkpoints.restore_checkpoint(
                self._stub,
                record.start.job_id,
                record.paths.checkpoint_dir,
                scratch=record.paths.scratch_dir,
            )
        except (RestoreError, ArchiveError, OSError) as error:
            log.warning("task %s: %s", record.task_id, error)
            record.add_log(
                "stderr", f"mwms-agent: could not restore the checkpoint ({error}); starting without it"
            )
            return
        if size:
            log.info("restored the checkpoint of job %s (%d bytes)", record.start.job_id, size)
            record.add_log("stderr", f"mwms-agent: restored the job's latest checkpoint ({size} bytes)")

    def _checkpoint_watcher(self, record: TaskRecord) -> CheckpointWatcher | None:
        """A watcher of the chief's checkpoint dir, unless checkpoints live on a shared filesystem."""
        if record.start.task_index != 0 or record.start.shared_checkpoint_dir:
            return None

        def upload(archive: Path) -> None:
            checkpoints.upload_checkpoint(self._stub, record.task_id, archive)

        return CheckpointWatcher(
            record.paths.checkpoint_dir, record.paths.scratch_dir, upload, within=record.paths.task_dir
        )

    def _spawn(self, record: TaskRecord, command: list[str], env: dict[str, str]) -> None:
        metrics_done = threading.Event()
        tail = MetricsTail(record.paths.metrics_file, within=record.paths.task_dir)
        watcher = self._checkpoint_watcher(record)

        def on_exit(exit_code: int) -> None:
            metrics_done.set()
            metrics_thread.join()
            if watcher is not None:
                watcher.finish()
            self._task_exited(record, exit_code, tail)

        switch, argv = self.launch_for(record, command)
        if self._scope_sockets and has_co_located_peer(record.start.tf_config, record.start.task_index):
            record.add_log(
                "stderr",
                "mwms-agent: this worker shares its machine with another of its job's workers, so host "
                "abstract unix sockets stay reachable to it (NCCL passes CUDA memory handles over them)",
            )
        process = TaskProcess(argv, env, record.paths.bundle_dir, record.add_log, on_exit, **switch)
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
            if watcher is not None:
                watcher.start()
            metrics_thread.start()
            try:
                pid = process.start()
            except BaseException:
                metrics_done.set()
                if watcher is not None:
                    watcher.cancel()
                raise
            record.process = process
            record.pid = pid
            record.start_ticks = agent_state.process_start_ticks(pid)
            self._publish(record, agent_pb2.TASK_STATE_RUNNING, pid=pid)
        log.info("task %s running as pid %d", record.task_id, pid)

    def _tail_metrics(self, record: TaskRecord, tail: MetricsTail, done: threading.Event) -> None:
        next_disk_check = time.monotonic() + DISK_POLL_SECONDS
        while not done.wait(METRICS_POLL_SECONDS):
            self._poll_metrics(record, tail)
            if time.monotonic() >= next_disk_check:
                self._check_disk(record)
                next_disk_check = time.monotonic() + DISK_POLL_SECONDS

    def _check_disk(self, record: TaskRecord) -> None:
        """Ends the task (FAILED, with the reason) once its files hold more than --task-disk-max."""
        if self._limits is None or self._limits.disk_max_bytes <= 0 or record.limit_breach:
            return
        used = disk_usage(record.paths.task_dir, skip=[record.paths.bundle_dir])
        if used <= self._limits.disk_max_bytes:
            return
        record.limit_breach = self._limits.over_disk(used)
        log.warning("task %s: %s", record.task_id, record.limit_breach)
        record.add_log("stderr", f"mwms-agent: {record.limit_breach}")
        process = record.process
        if process is not None:
            threading.Thread(
                target=process.terminate,
                args=(self._default_grace,),
                name=f"disk-{record.task_id}",
                daemon=True,
            ).start()

    @staticmethod
    def _poll_metrics(record: TaskRecord, tail: MetricsTail) -> None:
        points, warnings = tail.poll()
        for warning in warnings:
            record.add_log("stderr", warning)
        for point in points:
            record.add_metric(point)

    def _task_exited(self, record: TaskRecord, exit_code: int, tail: MetricsTail) -> None:
        self._poll_metrics(record, tail)
        oom = exit_code != 0 and record.cgroup is not None and record.cgroup.oom_killed()
        if oom and record.cgroup is not None and self._limits is not None and not record.limit_breach:
            record.limit_breach = self._limits.out_of_memory(record.start, record.cgroup.limits)
            record.add_log("stderr", f"mwms-agent: {record.limit_breach}")
        if record.limit_breach is not None and record.stop_reason is None:
            state, message = agent_pb2.TASK_STATE_FAILED, record.limit_breach
            exit_code = exit_code or 1
        elif record.stop_reason is not None:
            state, message = agent_pb2.TASK_STATE_STOPPED, record.stop_reason
        elif exit_code == 0:
            state, message = agent_pb2.TASK_STATE_SUCCEEDED, describe_exit(0)
        else:
            state, message = agent_pb2.TASK_STATE_FAILED, describe_exit(exit_code)
            if record.missing_module is not None:
                message += f"; {import_failures.explain(record.missing_module, record.environment)}"
        if record.start.task_index == 0:
            self._upload_artifacts(record)
        log.info("task %s ended: %s", record.task_id, message)
        pid = record.process.pid if record.process else 0
        self._release_identity(record)
        self._publish(record, state, message=message, exit_code=exit_code, pid=pid)

    def _upload_artifacts(self, record: TaskRecord) -> None:
        output = record.paths.output_dir
        if not artifacts.directory_has_files(output):
            return
        archive = record.paths.scratch_dir / "artifacts.tar.gz"
        try:
            pack_beneath(record.paths.task_dir, output, archive)
            response = artifacts.upload_archive(
                self._stub, record.task_id, agent_pb2.FILE_KIND_ARTIFACTS, archive
            )
            log.info("uploaded artifacts of task %s (%d bytes)", record.task_id, response.size)
        except Exception as error:  # noqa: BLE001 - a failed upload must not hide the task's final state
            log.warning("could not upload the artifacts of task %s: %s", record.task_id, error)
            record.add_log("stderr", f"mwms-agent: could not upload the artifacts: {error}")
        finally:
            archive.unlink(missing_ok=True)
