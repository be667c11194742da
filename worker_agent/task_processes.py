"""The processes of this agent's tasks: confining, spawning, watching and ending them.

`TaskProcesses` gives a task its identity (its own uid, or the agent's), its job's /dev/shm and IPC
namespace, its cgroup with its limits and the rules on its ports, launches its command in the sandbox,
tails its metrics and measures its files against --task-disk-max while it runs, notes an out-of-memory
kill when it exits, and gives all of that back once it has ended. After an agent restart it stops what
the previous agent process left running and reclaims its uids, shares and cgroups. TaskManager
(worker_agent/tasks.py) decides when, and reports what became of the task.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mwms.v1 import agent_pb2
from mwms.worker_agent import agent_state
from mwms.worker_agent.cgroups import TaskCgroups
from mwms.worker_agent.checkpoints import CheckpointWatcher
from mwms.worker_agent.environments import Environment
from mwms.worker_agent.gpu_nodes import GpuNode
from mwms.worker_agent.job_shares import JobShares
from mwms.worker_agent.landlock import has_co_located_peer
from mwms.worker_agent.metrics import MetricsTail
from mwms.worker_agent.port_guard import PortGuard
from mwms.worker_agent.runner import TaskProcess
from mwms.worker_agent.sandbox import Confinement
from mwms.worker_agent.task_limits import LimitPolicy, disk_usage
from mwms.worker_agent.task_record import TERMINAL_STATES, TaskRecord
from mwms.worker_agent.task_users import TaskIdentity, end_processes_of
from mwms.worker_agent.warm_pool import WarmSlot

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


def terminate_in_background(process: TaskProcess, grace: float, name: str | None = None) -> None:
    """Ends the task's process (SIGTERM, then SIGKILL after `grace`) in a thread of its own."""
    threading.Thread(target=process.terminate, args=(grace,), name=name, daemon=True).start()


def poll_metrics(record: TaskRecord, tail: MetricsTail) -> None:
    """Moves the metric points the task wrote since the last poll to its outbox; bad lines are noted."""
    points, warnings = tail.poll()
    for warning in warnings:
        record.add_log("stderr", warning)
    for point in points:
        record.add_metric(point)


class TaskProcesses:
    """Confines, spawns, watches and ends the tasks' processes, and gives back what they held."""

    def __init__(
        self,
        work_dir: Path,
        confinement: Confinement,
        gpus: Mapping[int, GpuNode],
        cgroups: TaskCgroups | None,
        limits: LimitPolicy | None,
        port_guard: PortGuard | None,
        scope_sockets: bool,
        default_grace_seconds: float,
    ) -> None:
        # Each task's cgroup and its limits (worker_agent/cgroups.py, task_limits.py); without cgroups
        # (an agent that is neither root nor delegated one) only the disk limit holds.
        self._cgroups = cgroups
        self._limits = limits
        # The rules on each task's ports (worker_agent/port_guard.py), on its cgroup.
        self._port_guard = port_guard
        # Host abstract unix sockets out of tasks' reach (worker_agent/landlock.py), where the kernel can.
        self._scope_sockets = scope_sockets
        self._confinement = confinement
        # The GPUs this agent offers by host index (worker_agent/gpu_nodes.py); none: tasks are told the
        # indices they were given alone.
        self._gpus = dict(gpus)
        self._shares = JobShares(work_dir)
        self._default_grace = default_grace_seconds

    @property
    def sandboxed(self) -> bool:
        """Whether tasks run in the sandbox (else unconfined, as the agent's own user or theirs)."""
        return self._confinement.sandboxed

    def take_over(self, entries: list[agent_state.TaskEntry], grace_seconds: float) -> set[str]:
        """Stops the process groups of a previous agent process's tasks that are still alive (SIGTERM,
        SIGKILL after `grace_seconds`), reclaims their uids, shares and cgroups; returns the ids of the
        tasks stopped here."""
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
        return stopped

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

    def gpus_of(self, start: agent_pb2.StartTask) -> list[GpuNode]:
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

    def confine(self, record: TaskRecord) -> TaskIdentity:
        """Gives the task its identity, its job's share (sandboxed) and its cgroup with the rules on its
        ports (`record.identity`, `.share`, `.cgroup`); returns the identity."""
        start = record.start
        identity = self._confinement.users.acquire(record.task_id, start.job_id)
        record.identity = identity
        if self._confinement.sandboxed:
            record.share = self._shares.acquire(start.job_id, record.task_id, identity.uid, identity.gid)
        if self._cgroups is not None and self._limits is not None:
            record.cgroup = self._cgroups.create(record.task_id, self._limits.limits(start))
            self._guard_ports(record)
        return identity

    def memory_limit(self, start: agent_pb2.StartTask) -> int:
        """The memory limit the task's cgroup gets here (0: none)."""
        if self._cgroups is None or self._limits is None:
            return 0
        return self._limits.limits(start).memory_bytes

    def confine_warm(self, record: TaskRecord, slot: WarmSlot) -> TaskIdentity:
        """Gives the task what the warm interpreter `slot` was started with: its task dir, its uid (now
        the task's and its job's), its cgroup, held to the task's limits and ports from now on (a warm
        task shares nothing with other tasks of its job: it has no co-located peer)."""
        start = record.start
        record.paths = dataclasses.replace(slot.paths, scratch_dir=record.paths.scratch_dir)
        record.identity = self._confinement.users.transfer(slot.slot_id, record.task_id, start.job_id)
        record.cgroup, slot.cgroup = slot.cgroup, None
        if self._cgroups is not None and self._limits is not None and record.cgroup is not None:
            self._cgroups.limit(record.cgroup, self._limits.limits(start))
            self._guard_ports(record)
        return record.identity

    def _guard_ports(self, record: TaskRecord) -> None:
        """Puts the rules on the task's ports on its cgroup: it binds only its own port of the guarded
        ranges, and reaches them only at its job's peers."""
        bpf_dir = record.cgroup.bpf_dir if record.cgroup is not None else None
        if self._port_guard is None or bpf_dir is None:
            return
        start = record.start
        guarded = [(span.low, span.high) for span in start.guarded_ports]
        self._port_guard.attach(bpf_dir, self._port_guard.rules(start.port, guarded, start.tf_config))

    def launch_for(self, record: TaskRecord, command: list[str]) -> TaskProcessArgs:
        """The argv and identity switch that run `command` confined as the task's user."""
        identity = record.identity
        assert identity is not None, "the task has no identity yet"
        gpus = self.gpus_of(record.start) if self._confinement.sandboxed else []
        readable = [] if record.environment is None else environment_paths(record.environment)
        scope = self._scope_sockets and not has_co_located_peer(
            record.start.tf_config, record.start.task_index
        )
        launch = self._confinement.launch(
            command, record.paths, identity, gpus, readable, record.share, record.cgroup, scope
        )
        return {"user": launch.user, "group": launch.group, "spare_leader": launch.spare_leader}, launch.argv

    def spawn(
        self,
        record: TaskRecord,
        command: list[str],
        env: dict[str, str],
        watcher: CheckpointWatcher | None,
        running: Callable[[int], object],
        exited: Callable[[int], None],
        warm: WarmSlot | None = None,
    ) -> None:
        """Starts the task's process unless the task ended meanwhile; `running(pid)` is called under the
        record's lock right after the spawn, `exited(exit_code)` once the process has ended and its last
        metric points are in. `warm`: the warm interpreter (confined for the task by `confine_warm`) that
        runs `command` instead of a new process."""
        metrics_done = threading.Event()
        tail = MetricsTail(record.paths.metrics_file, within=record.paths.task_dir)
        metrics_thread = threading.Thread(
            target=self._tail_metrics,
            args=(record, tail, metrics_done),
            name=f"metrics-{record.task_id}",
            daemon=True,
        )

        def on_exit(exit_code: int) -> None:
            metrics_done.set()
            metrics_thread.join()
            if watcher is not None:
                watcher.finish()
            self._note_exit(record, exit_code, tail)
            exited(exit_code)

        process = warm.process if warm is not None else self._process_for(record, command, env, on_exit)
        assert process is not None
        # Held across spawn and the RUNNING report, so a fast exit cannot report before RUNNING.
        with record.lock:
            if record.ended:
                return
            if watcher is not None:
                watcher.start()
            metrics_thread.start()
            try:
                if warm is not None:  # the program and its arguments go to the warm interpreter
                    pid = warm.hand_over(env, command[1:], record.add_log, on_exit)
                else:
                    pid = process.start()
            except BaseException:
                metrics_done.set()
                if watcher is not None:
                    watcher.cancel()
                raise
            record.process = process
            record.pid = pid
            record.start_ticks = agent_state.process_start_ticks(pid)
            running(pid)
        how = f" (warm interpreter {warm.slot_id})" if warm is not None else ""
        log.info("task %s running as pid %d%s", record.task_id, pid, how)

    def _process_for(
        self, record: TaskRecord, command: list[str], env: dict[str, str], on_exit: Callable[[int], None]
    ) -> TaskProcess:
        """The task's process, confined, not started yet."""
        switch, argv = self.launch_for(record, command)
        if self._scope_sockets and has_co_located_peer(record.start.tf_config, record.start.task_index):
            record.add_log(
                "stderr",
                "mwms-agent: this worker shares its machine with another of its job's workers, so host "
                "abstract unix sockets stay reachable to it (NCCL passes CUDA memory handles over them)",
            )
        return TaskProcess(argv, env, record.paths.bundle_dir, record.add_log, on_exit, **switch)

    def _tail_metrics(self, record: TaskRecord, tail: MetricsTail, done: threading.Event) -> None:
        next_disk_check = time.monotonic() + DISK_POLL_SECONDS
        while not done.wait(METRICS_POLL_SECONDS):
            poll_metrics(record, tail)
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
            terminate_in_background(process, self._default_grace, name=f"disk-{record.task_id}")

    def _note_exit(self, record: TaskRecord, exit_code: int, tail: MetricsTail) -> None:
        """Reads the task's last metric points; an out-of-memory kill becomes its limit breach."""
        poll_metrics(record, tail)
        oom = exit_code != 0 and record.cgroup is not None and record.cgroup.oom_killed()
        if oom and record.cgroup is not None and self._limits is not None and not record.limit_breach:
            record.limit_breach = self._limits.out_of_memory(record.start, record.cgroup.limits)
            record.add_log("stderr", f"mwms-agent: {record.limit_breach}")

    def release(self, record: TaskRecord) -> None:
        """Gives back the task's share, cgroup and uid, once no process of it can be left (ended with its
        sandbox, or ended here: a uid of its own is the task's alone, so whatever still runs as it was
        the task's)."""
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
