"""One run of a task on this agent: bringing it up in its start thread, and its end.

Bringing it up: the checks (its port free, its command there), its bundle, its confinement, its task dir,
its job's own Python environment and the gang's preflight check, then its process. Every way a start can
fail becomes the report the coordinator must hear: REJECTED (placed again) or FAILED, never started.
Once the process has ended, its final state is reported after the chief's artifacts are uploaded and what
the task held is given back. The files are the `TaskWorkspace`'s (worker_agent/task_workspace.py), the
processes the `TaskProcesses`' (worker_agent/task_processes.py); reports go out through the TaskManager's
`publish` (worker_agent/tasks.py), which keeps the task table.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

from mwms import task_environment
from mwms.archive import ArchiveError
from mwms.v1 import agent_pb2
from mwms.worker_agent import import_failures, preflight
from mwms.worker_agent.bundles import BundleError
from mwms.worker_agent.cgroups import CgroupError
from mwms.worker_agent.environments import Environment, EnvironmentBuildError
from mwms.worker_agent.gpu_nodes import GpuNode
from mwms.worker_agent.landlock import has_co_located_peer
from mwms.worker_agent.port_guard import PortGuardError
from mwms.worker_agent.runner import CommandNotRunnable, check_runnable, describe_exit, spawn_refusal
from mwms.worker_agent.task_env import child_environment, in_environment, resolve_command
from mwms.worker_agent.task_processes import TaskProcesses, UnknownGpu
from mwms.worker_agent.task_record import State, TaskRecord, port_is_free
from mwms.worker_agent.task_users import TaskUserError
from mwms.worker_agent.task_workspace import TaskWorkspace
from mwms.worker_agent.warm_choice import NO_WARM_INTERPRETER, StartShape, cold_reason
from mwms.worker_agent.warm_pool import WarmPool, WarmSlot

log = logging.getLogger("mwms.agent.tasks")


class Publish(Protocol):
    """TaskManager._publish: moves the task to `state` and queues the report (False once it has ended)."""

    def __call__(
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
    ) -> bool: ...


class TaskRuns:
    """Brings tasks up (`start`, in their start threads) and reports their ends."""

    def __init__(
        self,
        hostname: str,
        workspace: TaskWorkspace,
        processes: TaskProcesses,
        publish: Publish,
        preflight_done: Callable[[agent_pb2.PreflightResult], None],
        pool: WarmPool | None = None,
    ) -> None:
        self._hostname = hostname
        # Warm interpreters (worker_agent/warm_pool.py), where the agent keeps them (--warm-pool).
        self._pool = pool
        self._workspace = workspace
        self._processes = processes
        self._publish = publish
        # Queues a preflight result for the connection to send (before the reports taken with it).
        self._preflight_done = preflight_done

    def _reject(self, record: TaskRecord, message: str) -> None:
        log.warning("task %s rejected: %s", record.task_id, message)
        self._publish(record, agent_pb2.TASK_STATE_REJECTED, message=message)

    def start(self, record: TaskRecord) -> None:
        """Brings the task up, or reports why it could not start."""
        start = record.start
        command: list[str] = []
        shown = start.command[0] if start.command else ""
        warm: WarmSlot | None = None
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
            archive = self._workspace.fetch_bundle(start)
            if record.ended:
                return
            gpus = self._processes.gpus_of(start)
            warm = self._choose_warm(record, command, gpus)
            if warm is not None:
                identity = self._processes.confine_warm(record, warm)
                self._workspace.prepare_warm(record, archive, identity, warm.paths.scratch_dir)
            else:
                identity = self._processes.confine(record)
                self._workspace.prepare(record, archive, identity)
            if record.ended:
                self.release(record)
                return
            environment = None
            if start.environment_lock:
                environment = self._build_environment(record)
                if environment is None:
                    self.release(record)
                    return
                command = resolve_command(list(start.command), str(environment.python))
            env = child_environment(
                start,
                record.paths,
                os.environ,
                (identity.name, identity.shared),
                gpus=gpus,
                sandboxed=self._processes.sandboxed,
            )
            if environment is not None:
                env = in_environment(env, environment.prefix)
            check_runnable(command[0], shown, env.get("PATH"), record.paths.bundle_dir)
            if start.preflight and not self._preflight_passed(record, env):
                self.release(record)
                return
            self._spawn(record, command, env, warm)
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
        if warm is not None and record.process is None:
            warm.kill()  # handed no task: it ran nothing, and its uid and cgroup are the task's to give back
        if record.ended and record.process is None:
            self.release(record)

    def _build_environment(self, record: TaskRecord) -> Environment | None:
        """The job's own Python environment, built with uv (or found in the cache) and held for the task;
        None when the task ended meanwhile or the build failed (reported: FAILED, never started, when no
        retry can help; REJECTED, placed again, when it can). Its lines go to the task's log."""
        self._publish(
            record,
            agent_pb2.TASK_STATE_STARTING,
            message="building the job's Python environment",
            environment=agent_pb2.ENVIRONMENT_STATUS_BUILDING,
        )
        try:
            environment = self._workspace.acquire_environment(record)
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

    def _preflight_passed(self, record: TaskRecord, env: dict[str, str]) -> bool:
        """Runs the gang's preflight check (worker_agent/preflight.py); False when the task ended instead."""
        outcome = preflight.run_check(
            record, env, lambda command: self._processes.launch_for(record, command)
        )
        if outcome.stopped:
            self._publish(record, agent_pb2.TASK_STATE_STOPPED, message=record.stop_reason or "stopped")
            return False
        self._preflight_done(outcome.result(record.task_id))
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

    def _choose_warm(self, record: TaskRecord, command: list[str], gpus: list[GpuNode]) -> WarmSlot | None:
        """A warm interpreter taken from the pool for the task, or None (a cold start); either way its log
        says which, and a cold start why (worker_agent/warm_choice.py)."""
        if self._pool is None:
            return None
        start = record.start
        sandboxed = self._processes.sandboxed
        key = self._pool.key_of(gpus)
        slot = self._pool.peek(key)
        shape = StartShape(
            command=command,
            env=child_environment(start, record.paths, os.environ, gpus=gpus, sandboxed=sandboxed),
            own_environment=bool(start.environment_lock),
            preflight=start.preflight,
            shared_checkpoints=bool(start.shared_checkpoint_dir),
            co_located_peer=has_co_located_peer(start.tf_config, start.task_index),
            memory_limit_bytes=self._processes.memory_limit(start),
        )
        kept = self._pool.keeps(key)
        reason = cold_reason(
            shape,
            sys.executable,
            self._pool.env_of(key),
            kept=kept,
            ready=slot is not None,
            warm_memory_bytes=self._pool.held_bytes(slot) if slot is not None else 0,
        )
        if not reason and slot is not None and not self._pool.take(slot):
            reason = NO_WARM_INTERPRETER
        if reason:
            record.add_log("stderr", f"mwms-agent: cold start: {reason}")
            return None
        assert slot is not None
        if slot.ready.is_set():
            said = f"imported TensorFlow {time.monotonic() - slot.ready_at:.0f} s ago and runs the program"
        else:
            importing = time.monotonic() - slot.started_at
            said = f"has been importing TensorFlow for {importing:.1f} s and runs the program once it has"
        record.add_log("stderr", f"mwms-agent: warm start: {slot.slot_id} {said}")
        return slot

    def _spawn(
        self, record: TaskRecord, command: list[str], env: dict[str, str], warm: WarmSlot | None
    ) -> None:
        """Starts the task's process (worker_agent/task_processes.py), or hands it to its warm interpreter:
        RUNNING once spawned (with how it started), its final state once it has ended."""
        kind = agent_pb2.START_KIND_WARM if warm is not None else agent_pb2.START_KIND_COLD
        self._processes.spawn(
            record,
            command,
            env,
            self._workspace.checkpoint_watcher(record),
            running=lambda pid: self._publish(record, agent_pb2.TASK_STATE_RUNNING, pid=pid, start_kind=kind),
            exited=lambda exit_code: self._exited(record, exit_code),
            warm=warm,
        )

    def _exited(self, record: TaskRecord, exit_code: int) -> None:
        """Reports how the task ended (its last metric points are in, an OOM kill noted), once the chief's
        artifacts are uploaded and what it held is given back."""
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
            self._workspace.upload_artifacts(record)
        log.info("task %s ended: %s", record.task_id, message)
        pid = record.process.pid if record.process else 0
        self.release(record)
        self._publish(record, state, message=message, exit_code=exit_code, pid=pid)

    def release(self, record: TaskRecord) -> None:
        """Gives the task's uid back, once no process of it can be left (ended with its sandbox, or ended
        here: a uid of its own is the task's alone, so whatever still runs as it was the task's), and its
        hold on its environment (which the cache may then evict)."""
        self._workspace.release_environment(record)
        self._processes.release(record)
