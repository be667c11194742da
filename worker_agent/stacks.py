"""Taking the Python stacks of a task's process for a DumpStacks command: py-spy, else faulthandler.

py-spy reads the stacks of every thread from outside (it needs ptrace, which containers often forbid).
Otherwise the handler that worker_agent/stack_handler/sitecustomize.py installs in every task answers
SIGUSR2 by writing them to <stacks dir>/<pid>.txt; the agent signals, waits (bounded) for the file to
grow and stop growing, and reads what was added. Either way the text is bounded (MAX_STACK_BYTES).

A dump holds several snapshots spaced apart (mwms/stack_dumps.py: 3 over about a second), so that a
healthy loop caught between two collectives once is not taken for a worker outside them.

Each named task is dumped in a thread of its own, at the same time, and each answer goes to `send`
as soon as it is ready; the connection's stream thread never waits for a dump.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mwms import stack_dumps, task_environment
from mwms.stack_dumps import (
    MAX_SNAPSHOT_SPACING_S,
    MAX_SNAPSHOTS,
    MAX_STACK_BYTES,
    SNAPSHOT_SPACING_S,
    SNAPSHOTS,
)
from mwms.v1 import agent_pb2
from mwms.worker_agent.task_files import open_beneath, read_beneath

if TYPE_CHECKING:
    from mwms.worker_agent.task_record import TaskRecord

log = logging.getLogger("mwms.agent.stacks")

# The contract with stack_handler/sitecustomize.py: the directory's variable, the signal, the file name.
STACKS_DIR_ENV = task_environment.STACKS_DIR
STACKS_SIGNAL = signal.SIGUSR2
HANDLER_DIR = Path(__file__).parent / "stack_handler"
# A warm task's outermost frames are its warm interpreter's (worker_agent/warm_interpreter.py), which ran
# the program: left out, as a cold start of the program has none (faulthandler names the file as Python
# ran it, py-spy by its last directories).
WARM_FRAME_MARKS = (
    f'"{Path(__file__).resolve().with_name("warm_interpreter.py")}"',
    "worker_agent/warm_interpreter.py:",
)
# "auto" (py-spy when it can trace, else faulthandler), "py-spy" or "faulthandler"; read by the agent.
METHOD_ENV = "MWMS_AGENT_STACK_METHOD"
METHODS = ("auto", "py-spy", "faulthandler")
PY_SPY_TIMEOUT_S = 5.0
HANDLER_TIMEOUT_S = 3.0
# The handler writes a dump in many small writes: it is complete once the file stops growing this long.
HANDLER_SETTLE_S = 0.15
POLL_S = 0.02


@dataclass(frozen=True)
class TakenStacks:
    """What one attempt at taking a process's stacks gave: the text, or why there is none."""

    pid: int
    method: str = ""
    text: str = ""
    error: str = ""


def stacks_dir(task_dir: Path) -> Path:
    """Where the tasks' handlers write their dumps: one file per Python process of the task."""
    return task_dir / "stacks"


def handler_environment(env: Mapping[str, str], directory: Path) -> dict[str, str]:
    """The variables a task needs for the handler: PYTHONPATH with the handler's directory first."""
    python_path = env.get(task_environment.PYTHONPATH, "")
    return {
        STACKS_DIR_ENV: str(directory),
        task_environment.PYTHONPATH: str(HANDLER_DIR) + (os.pathsep + python_path if python_path else ""),
    }


def preferred_method(env: Mapping[str, str] | None = None) -> str:
    """The agent's choice of method from MWMS_AGENT_STACK_METHOD (default "auto")."""
    value = (env if env is not None else os.environ).get(METHOD_ENV, "auto").strip().lower() or "auto"
    if value not in METHODS:
        log.warning("%s=%r is none of %s; using auto", METHOD_ENV, value, ", ".join(METHODS))
        return "auto"
    return value


def bounded(text: str, limit: int = MAX_STACK_BYTES) -> str:
    """`text` cut to at most `limit` bytes of UTF-8, saying so when it was cut."""
    return stack_dumps.bounded(text, "the agent", limit)


def namespace_pid(pid: int) -> int:
    """`pid` as the process itself sees it (innermost of /proc/<pid>/status NSpid): its pid inside a
    sandbox's PID namespace, else `pid`."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def group_members(pgid: int) -> list[int]:
    """The pids (as this agent sees them) of the processes in process group `pgid`, lowest first."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid:
                members.append(int(entry.name))
        except (ProcessLookupError, PermissionError):
            continue
    return sorted(members)


def python_pid(pid: int, directory: Path | None) -> tuple[int, int]:
    """The task's Python process as (pid here, pid it sees itself as): the group leader `pid` when its
    handler registered, else the member of the group whose handler registered first (a task running
    Python under a shell or in a sandbox), else the first member that is not the sandbox's own."""
    if directory is not None and (directory / f"{pid}.txt").exists() and namespace_pid(pid) == pid:
        return pid, pid
    members = group_members(pid)
    if directory is not None:
        registered = [(namespace_pid(m), m) for m in members]
        registered = [(inner, m) for inner, m in registered if (directory / f"{inner}.txt").exists()]
        if registered:
            inner, outer = min(registered)
            return outer, inner
    for member in members:
        try:
            if os.path.basename(os.readlink(f"/proc/{member}/exe")) != "bwrap":
                return member, namespace_pid(member)
        except OSError:
            continue
    return pid, pid


def py_spy_executable() -> str | None:
    """py-spy next to the agent's interpreter (a venv not on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def dump_with_py_spy(pid: int, executable: str, timeout_s: float = PY_SPY_TIMEOUT_S) -> TakenStacks:
    try:
        done = subprocess.run(
            [executable, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return TakenStacks(pid, "py-spy", error=f"py-spy did not answer within {timeout_s:.0f} s")
    except OSError as error:
        return TakenStacks(pid, "py-spy", error=f"py-spy could not run: {error}")
    if done.returncode != 0 or "Thread " not in done.stdout:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()
        return TakenStacks(pid, "py-spy", error=f"py-spy: {why[-1][:300] if why else 'no output'}")
    return TakenStacks(pid, "py-spy", text=bounded(done.stdout))


_handler_locks: dict[int, threading.Lock] = {}
_handler_locks_guard = threading.Lock()


def dump_with_handler(
    pid: int, directory: Path, timeout_s: float = HANDLER_TIMEOUT_S, inner_pid: int | None = None
) -> TakenStacks:
    """Signals the handler of `pid` and reads the dump it appends to its file (named by `inner_pid`,
    the pid the process sees itself as, when it runs in a sandbox's PID namespace).

    The file lies in a directory the task can write: it is read without following links.
    """
    path = directory / f"{pid if inner_pid is None else inner_pid}.txt"
    if not path.exists():
        return TakenStacks(
            pid,
            "faulthandler",
            error=f"process {pid} has no stack handler (it is not Python, or runs with -I or -S)",
        )

    def size_now() -> int:
        fd = open_beneath(directory.parent, path)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    with _handler_locks_guard:
        lock = _handler_locks.setdefault(pid, threading.Lock())
    with lock:  # two dumps of one process at once would interleave in its file
        try:
            before = size_now()
        except OSError as error:
            return TakenStacks(pid, "faulthandler", error=f"the handler's file is not readable: {error}")
        try:
            os.kill(pid, STACKS_SIGNAL)
        except ProcessLookupError:
            return TakenStacks(pid, "faulthandler", error=f"process {pid} has ended")
        except PermissionError as error:
            return TakenStacks(pid, "faulthandler", error=f"cannot signal process {pid}: {error}")
        deadline = time.monotonic() + timeout_s
        size, changed_at = before, time.monotonic()
        while time.monotonic() < deadline:
            try:
                current = size_now()
            except OSError as error:
                return TakenStacks(pid, "faulthandler", error=f"the handler's file is not readable: {error}")
            if current != size:
                size, changed_at = current, time.monotonic()
            elif size > before and time.monotonic() - changed_at >= HANDLER_SETTLE_S:
                break
            time.sleep(POLL_S)
        if size == before:
            return TakenStacks(
                pid,
                "faulthandler",
                error=f"the stack handler of process {pid} did not answer in {timeout_s:.0f} s",
            )
        try:
            data = read_beneath(directory.parent, path, MAX_STACK_BYTES + 1, before)
        except OSError as error:
            return TakenStacks(pid, "faulthandler", error=f"the handler's file is not readable: {error}")
    return TakenStacks(pid, "faulthandler", text=bounded(data.decode("utf-8", errors="replace")))


def without_warm_frames(text: str) -> str:
    """The stacks of a warm task as a cold start of its program shows them (WARM_FRAME_MARKS)."""
    if "warm_interpreter.py" not in text:
        return text
    return "\n".join(line for line in text.split("\n") if not any(mark in line for mark in WARM_FRAME_MARKS))


def take_stacks(pid: int, directory: Path | None, method: str = "auto") -> TakenStacks:
    """The stacks of the task whose process (group leader) is `pid`, by `method` with its fallback."""
    target, inner = python_pid(pid, directory)
    errors = []
    if method in ("auto", "py-spy"):
        executable = py_spy_executable()
        if executable is None:
            errors.append("py-spy is not installed")
        else:
            taken = dump_with_py_spy(target, executable)
            if not taken.error:
                return TakenStacks(taken.pid, taken.method, without_warm_frames(taken.text))
            errors.append(taken.error)
    if method in ("auto", "faulthandler"):
        if directory is None:
            errors.append("the task was started without the stack handler")
        else:
            taken = dump_with_handler(target, directory, inner_pid=inner)
            if not taken.error:
                return TakenStacks(taken.pid, taken.method, without_warm_frames(taken.text))
            errors.append(taken.error)
    return TakenStacks(target, error="; ".join(errors))


def take_snapshots(
    pid: int,
    directory: Path | None,
    method: str = "auto",
    count: int = SNAPSHOTS,
    spacing_s: float = SNAPSHOT_SPACING_S,
) -> TakenStacks:
    """`count` snapshots of the task's stacks, `spacing_s` apart (both bounded), as one text
    (stack_dumps.join_snapshots). The method that answered first takes the later ones; when a later one
    fails (the process ended), the text holds those taken and the error says why the rest are missing."""
    count = min(max(1, count), MAX_SNAPSHOTS)
    spacing_s = min(max(0.0, spacing_s), MAX_SNAPSHOT_SPACING_S)
    share = MAX_STACK_BYTES // count - 100  # room for the marker lines: the whole stays within the bound
    started = time.monotonic()
    first = take_stacks(pid, directory, method)
    if first.error:
        return first
    texts, offsets = [bounded(first.text, share)], [0.0]
    missing = ""
    for number in range(1, count):
        delay = started + number * spacing_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        offset = time.monotonic() - started
        taken = take_stacks(pid, directory, first.method)
        if taken.error:
            missing = f"took {len(texts)} of {count} snapshots: {taken.error}"
            break
        texts.append(bounded(taken.text, share))
        offsets.append(offset)
    text = bounded(stack_dumps.join_snapshots(texts, offsets))
    return TakenStacks(first.pid, first.method, text=text, error=missing)


@dataclass(frozen=True)
class DumpTarget:
    """A task as the dumper sees it: its process, its handler's directory, or why it cannot be dumped."""

    task_id: str
    pid: int = 0
    directory: Path | None = None
    unavailable: str = ""


def dump_targets(task_ids: Iterable[str], records: Iterable[TaskRecord]) -> list[DumpTarget]:
    """What to dump for each task named: its process, or why it has none on this agent."""
    known = {record.task_id: record for record in records}
    targets = []
    for task_id in dict.fromkeys(task_ids):
        record = known.get(task_id)
        if record is None:
            targets.append(DumpTarget(task_id, unavailable=f"task {task_id} is not known to this agent"))
            continue
        with record.lock:
            pid, ended, spawned = record.pid, record.ended, record.process is not None
        if ended:
            targets.append(DumpTarget(task_id, pid, unavailable=f"task {task_id} has ended"))
        elif not spawned:
            targets.append(
                DumpTarget(task_id, unavailable=f"task {task_id} is still starting (no process yet)")
            )
        else:
            targets.append(DumpTarget(task_id, pid, record.paths.stacks_dir))
    return targets


def answer_dump_stacks(
    request: agent_pb2.DumpStacks,
    targets: Iterable[DumpTarget],
    send: Callable[[agent_pb2.AgentMessage], None],
    method: str = "auto",
) -> None:
    """Dumps every target at once, each in its own thread; `send` gets one StackDump per task."""
    for target in targets:
        threading.Thread(
            target=_answer_one,
            args=(request.request_id, target, send, method),
            name=f"stacks-{target.task_id}",
            daemon=True,
        ).start()


def _answer_one(
    request_id: str, target: DumpTarget, send: Callable[[agent_pb2.AgentMessage], None], method: str
) -> None:
    if target.unavailable:
        taken = TakenStacks(target.pid, error=target.unavailable)
    else:
        try:
            taken = take_snapshots(target.pid, target.directory, method)
        except Exception as error:  # noqa: BLE001 - the coordinator still gets an answer for this task
            log.exception("taking the stacks of task %s failed", target.task_id)
            taken = TakenStacks(target.pid, error=f"the agent failed to take the stacks: {error}")
    if taken.error:
        log.info("stacks of task %s: %s", target.task_id, taken.error)
    dump = agent_pb2.StackDump(
        request_id=request_id,
        task_id=target.task_id,
        pid=taken.pid,
        method=taken.method,
        text=taken.text,
        error=taken.error,
        unix_ms=int(time.time() * 1000),
    )
    send(agent_pb2.AgentMessage(stacks=dump))
