"""Warm interpreters: sandboxed Pythons that imported TensorFlow before their task arrived (`--warm-pool N`).

`import tensorflow` takes seconds, paid by every worker of every attempt. The pool keeps N interpreters
(worker_agent/warm_interpreter.py) that paid it already, each waiting for ONE task, and nothing crosses jobs:
- each is started exactly as a task would be, by `Confinement.launch` (worker_agent/sandbox.py), with what a
  task gets made for it beforehand: a task dir of its own (`<work dir>/warm/slots/<slot>/task`, which
  jobs/<job>/attempt-<n>/task-<i> links to once it is a task's), a uid from TaskUsers,
  a cgroup; at handout those become the task's (its uid passed to the task's id and job, its limits and
  port rules written into the cgroup), and the task's bundle is extracted into the task dir its sandbox
  already binds;
- it runs nothing of a job before its handout, and ends with its task; a fresh one is started in the
  background after each handout, with the least CPU weight until its handout (running tasks come first:
  on a busy machine a warm-up waits, it does not slow a job down);
- its GPU device nodes are bound when its sandbox starts, so interpreters are kept per GPU set (by host
  index; none on a CPU agent): the agent's whole set by default, and a handout is replaced with its own set.
What differs from a cold start of the same task: its private /tmp and /dev/shm are sized by the kernel's
default rather than the task's memory limit (their pages count against that limit all the same).

Which tasks may start warm is worker_agent/warm_choice.py's; the start itself worker_agent/task_runs.py's.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent.cgroups import TaskCgroup, TaskCgroups, TaskLimits
from mwms.worker_agent.gpu_nodes import GpuNode
from mwms.worker_agent.runner import TaskProcess
from mwms.worker_agent.sandbox import Confinement
from mwms.worker_agent.stacks import group_members
from mwms.worker_agent.task_env import TaskPaths, child_environment
from mwms.worker_agent.task_users import TaskIdentity

log = logging.getLogger("mwms.agent.warm_pool")

INTERPRETER = Path(__file__).resolve().with_name("warm_interpreter.py")
# The last lines a warm interpreter printed before its handout (TensorFlow's import notes), for the agent's
# log should it end there. Not its task's: they are no output of the program (which may not import
# TensorFlow at all), and CUDA's own notes come when the program first touches a GPU, after the handout.
EARLY_LINES = 20
# After an interpreter ends before its handout (TensorFlow missing, a broken sandbox), the next one waits.
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0

Output = Callable[[str, str, bool], None]


class WarmSlot:
    """One warm interpreter and what it holds for its task: task dir, identity, cgroup, process."""

    def __init__(self, slot_id: str, key: tuple[int, ...], paths: TaskPaths, identity: TaskIdentity) -> None:
        self.slot_id = slot_id
        self.key = key  # the host indices of the GPUs bound into its sandbox
        self.paths = paths
        self.identity = identity
        self.cgroup: TaskCgroup | None = None
        self.env: dict[str, str] = {}  # what it was started with (worker_agent/warm_choice.py compares)
        self.process: TaskProcess | None = None
        self.channel: socket.socket | None = None
        self.ready = threading.Event()
        self.started_at = time.monotonic()
        self.ready_at = 0.0  # when it said ready (monotonic)
        self._lock = threading.Lock()
        self._early: collections.deque[str] = collections.deque(maxlen=EARLY_LINES)
        self._output: Output | None = None
        self._exit: Callable[[int], None] | None = None
        self.ended = threading.Event()

    def on_output(self, stream: str, text: str, redraw: bool) -> None:
        with self._lock:
            if self._output is None:
                self._early.append(text)
                return
            output = self._output
        output(stream, text, redraw)

    def on_exit(self, exit_code: int, before_handout: Callable[[WarmSlot, int], None]) -> None:
        with self._lock:
            handler = self._exit
            self.ended.set()
        if handler is not None:
            handler(exit_code)
        else:
            before_handout(self, exit_code)

    def hand_over(
        self, env: Mapping[str, str], argv: list[str], output: Output, exited: Callable[[int], None]
    ) -> int:
        """Gives the interpreter its task (its output and exit go to `output` and `exited` from now on);
        returns its pid. OSError when it has ended."""
        assert self.process is not None and self.channel is not None
        with self._lock:
            if self.ended.is_set():
                raise OSError(f"the warm interpreter {self.slot_id} has ended")
            self._output, self._exit = output, exited
            self._early.clear()
        task = {"env": dict(env), "cwd": str(self.paths.bundle_dir), "argv": argv}
        try:
            self.channel.sendall(json.dumps(task).encode())
        except OSError:
            with self._lock:  # it ended meanwhile: its end is no task's
                self._output = self._exit = None
            raise
        finally:
            self.channel.close()
        return self.process.pid

    def last_lines(self, count: int) -> list[str]:
        """The last lines it printed before a handout."""
        with self._lock:
            return list(self._early)[-count:]

    def kill(self) -> None:
        """Ends the interpreter (its whole sandbox) and waits for it; it has run nothing of a job."""
        if self.channel is not None:
            self.channel.close()
        if self.process is not None and not self.ended.is_set():
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.ended.wait(10.0)

    def memory_bytes(self) -> int:
        """The resident memory of its processes (the sandbox's and the interpreter's)."""
        if self.process is None or self.ended.is_set():
            return 0
        return sum(_rss(pid) for pid in group_members(self.process.pid))


class WarmPool:
    """Keeps `size` warm interpreters on this agent, hands each to one task and replaces it."""

    def __init__(
        self,
        size: int,
        work_dir: Path,
        confinement: Confinement,
        gpus: Mapping[int, GpuNode],
        cgroups: TaskCgroups | None,
        pids_max: int,
        scope_sockets: bool,
    ) -> None:
        self.size = size
        self._root = work_dir / "warm"
        self._scratch = work_dir / "scratch"
        self._confinement = confinement
        self._gpus = dict(gpus)
        self._cgroups = cgroups
        self._pids_max = pids_max
        self._scope_sockets = scope_sockets
        self._lock = threading.Lock()
        self._slots: list[WarmSlot] = []  # warming up or ready, not handed out
        self._numbers = iter(range(1, sys.maxsize))
        self._closed = False
        # The variables of the newest interpreter started per key, which a task's are compared with.
        self._envs: dict[tuple[int, ...], dict[str, str]] = {}
        # What an interpreter held once ready, per key: keys in it have had one ready (an import that works).
        self._held: dict[tuple[int, ...], int] = {}
        self._retry_s = RETRY_FIRST_S
        self.default_key = tuple(sorted(self._gpus))

    def start(self) -> None:
        """Clears what an earlier agent process left of its pool and starts the interpreters."""
        shutil.rmtree(self._root, ignore_errors=True)
        for _ in range(self.size):
            self._start_in_background(self.default_key)

    def key_of(self, gpus: list[GpuNode]) -> tuple[int, ...]:
        """The pool key of a task given `gpus`: their host indices, sorted."""
        return tuple(sorted(gpu.index for gpu in gpus))

    def peek(self, key: tuple[int, ...]) -> WarmSlot | None:
        """A ready interpreter for `key`, else the one importing TensorFlow longest where one for `key` was
        ready before (its import is known to work): the task waits for the rest of that import instead of
        paying a whole one cold. Left in the pool (its env is what a task is compared with)."""
        with self._lock:
            live = [s for s in self._slots if s.key == key and not s.ended.is_set()]
            ready = next((s for s in live if s.ready.is_set()), None)
            if ready is not None or key not in self._held:
                return ready
            return min(live, key=lambda s: s.started_at, default=None)

    def held_bytes(self, slot: WarmSlot) -> int:
        """The memory `slot` holds once TensorFlow is imported: its own if it is ready, else what the last
        ready interpreter of its key held (what a task's memory limit must leave room for)."""
        with self._lock:
            known = self._held.get(slot.key, 0)
        return slot.memory_bytes() if slot.ready.is_set() else known

    def keeps(self, key: tuple[int, ...]) -> bool:
        """Whether the pool keeps interpreters for the GPU set `key` (the agent's whole set, or one that
        an interpreter was handed out for and replaced with)."""
        with self._lock:
            return key == self.default_key or key in self._envs

    def env_of(self, key: tuple[int, ...]) -> dict[str, str] | None:
        """The variables the pool's interpreters for `key` start with (None: none was started yet)."""
        with self._lock:
            return self._envs.get(key)

    def take(self, slot: WarmSlot) -> bool:
        """Takes `slot` out of the pool for a task (False: another task took it first) and starts its
        replacement in the background."""
        with self._lock:
            if slot not in self._slots or self._closed or slot.ended.is_set():
                return False
            self._slots.remove(slot)
        self._start_in_background(slot.key)
        return True

    def ready_count(self) -> int:
        with self._lock:
            return sum(1 for slot in self._slots if slot.ready.is_set())

    def memory_bytes(self) -> int:
        """The resident memory of the interpreters waiting in the pool."""
        with self._lock:
            slots = list(self._slots)
        return sum(slot.memory_bytes() for slot in slots)

    def close(self) -> None:
        """Ends every interpreter not handed out and gives back what each held."""
        with self._lock:
            self._closed = True
            slots, self._slots = self._slots, []
        for slot in slots:
            self.discard(slot)

    def discard(self, slot: WarmSlot) -> None:
        """Ends an interpreter that will run no task and gives back its dir, cgroup and uid."""
        slot.kill()
        if slot.cgroup is not None:
            slot.cgroup.remove()
            slot.cgroup = None
        self._confinement.users.release(slot.slot_id)
        shutil.rmtree(slot.paths.task_dir.parent, ignore_errors=True)
        shutil.rmtree(slot.paths.scratch_dir, ignore_errors=True)

    def _start_in_background(self, key: tuple[int, ...], delay: float = 0.0) -> None:
        def run() -> None:
            if delay and self._closed_wait(delay):
                return
            try:
                self._start_one(key)
            except Exception:  # noqa: BLE001 - the pool is an optimisation: tasks start cold meanwhile
                log.exception("could not start a warm interpreter")

        threading.Thread(target=run, name="warm-pool-start", daemon=True).start()

    def _closed_wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._closed:
                return True
            time.sleep(0.2)
        return self._closed

    def _start_one(self, key: tuple[int, ...]) -> None:
        """Makes a slot's task dir, uid and cgroup, and starts its interpreter in them."""
        if self._closed:
            return
        slot_id = f"warm-{next(self._numbers)}"
        # Three levels under the work dir, as jobs/<job>/attempt-<n>/ (TaskPaths.create_fresh opens them).
        paths = TaskPaths.at(self._root / "slots" / slot_id / "task", self._scratch / slot_id)
        slot = WarmSlot(slot_id, key, paths, self._confinement.users.acquire(slot_id))
        try:
            self._spawn(slot)
        except BaseException:
            self.discard(slot)
            raise
        with self._lock:
            closed = self._closed
            if not closed:
                self._slots.append(slot)
                self._envs[slot.key] = slot.env
        if closed:
            self.discard(slot)
            return
        threading.Thread(target=self._await_ready, args=(slot,), name=f"{slot_id}-ready", daemon=True).start()

    def _spawn(self, slot: WarmSlot) -> None:
        paths, identity = slot.paths, slot.identity
        paths.create_fresh()
        if not identity.shared:
            paths.hand_over(identity.uid, identity.gid)
        if self._cgroups is not None:
            # The least CPU weight while it warms up: running tasks come first.
            slot.cgroup = self._cgroups.create(
                slot.slot_id, TaskLimits(pids_max=self._pids_max, background=True)
            )
        gpus = [self._gpus[index] for index in slot.key]
        kind = agent_pb2.DEVICE_KIND_GPU if slot.key else agent_pb2.DEVICE_KIND_CPU_SLOT
        placeholder = agent_pb2.StartTask(task_id=slot.slot_id, device_kind=kind, device_indices=slot.key)
        sandboxed = self._confinement.sandboxed
        slot.env = child_environment(
            placeholder,
            paths,
            os.environ,
            (identity.name, identity.shared),
            gpus=gpus,
            sandboxed=sandboxed,
        )
        ours, theirs = socket.socketpair()
        slot.channel = ours
        command = [sys.executable, str(INTERPRETER), str(theirs.fileno())]
        launch = self._confinement.launch(
            command, paths, identity, gpus if sandboxed else [], (), None, slot.cgroup, self._scope_sockets
        )
        slot.process = TaskProcess(
            launch.argv,
            slot.env,
            paths.bundle_dir,
            slot.on_output,
            lambda code: slot.on_exit(code, self._ended_before_handout),
            user=launch.user,
            group=launch.group,
            spare_leader=launch.spare_leader,
            pass_fds=(theirs.fileno(),),
        )
        try:
            slot.process.start()
        finally:
            theirs.close()

    def _await_ready(self, slot: WarmSlot) -> None:
        """Marks the slot ready once its interpreter says so (TensorFlow imported)."""
        assert slot.channel is not None
        try:
            said = slot.channel.recv(16)
        except OSError:
            said = b""
        if said.startswith(b"ready"):
            slot.ready_at = time.monotonic()
            # Not waiting: its task took it while it imported, and what it holds now is the task's.
            with self._lock:
                waiting = slot in self._slots
            if waiting:
                held = slot.memory_bytes()
                with self._lock:
                    self._held[slot.key] = held
            slot.ready.set()
            self._retry_s = RETRY_FIRST_S
            if not waiting:
                return
            log.info(
                "warm interpreter %s ready in %.1f s (GPUs %s)",
                slot.slot_id,
                slot.ready_at - slot.started_at,
                ",".join(map(str, slot.key)) or "none",
            )

    def _ended_before_handout(self, slot: WarmSlot, exit_code: int) -> None:
        """An interpreter ended in the pool: its last lines go to the agent's log, another follows later."""
        with self._lock:
            if slot not in self._slots:
                return  # taken (its task's start gives it up) or discarded
            self._slots.remove(slot)
            closed = self._closed
        if closed:
            return
        last = slot.last_lines(5)
        log.warning(
            "warm interpreter %s ended before its handout (exit code %d); another in %.0f s: %s",
            slot.slot_id,
            exit_code,
            self._retry_s,
            " | ".join(last) or "no output",
        )
        threading.Thread(target=self.discard, args=(slot,), daemon=True).start()
        self._start_in_background(slot.key, delay=self._retry_s)
        self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
