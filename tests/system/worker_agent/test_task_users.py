"""Task uids held host-wide and handed on only once nothing of their last holder is left
(worker_agent/task_users.py): real flocks, real processes running as the uids, real kernel keys and SysV
IPC objects, as root."""

from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import pwd
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mwms.worker_agent import task_users
from mwms.worker_agent.task_users import (
    TaskUserError,
    TaskUsers,
    end_processes_of,
    key_counts,
    leftovers_of,
)
from mwms_testkit import REPO

ROOT = os.geteuid() == 0
pytestmark = [
    pytest.mark.skipif(not ROOT, reason="changing a task's uid needs root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed"),
]
# A Python every uid can run (this one may live under /root); -I -S keep it from looking further.
CHILD_PYTHON = next(
    (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None
)
needs_child_python = pytest.mark.skipif(CHILD_PYTHON is None, reason="no system python3 for a task uid")
needs_keys = pytest.mark.skipif(
    not Path("/proc/key-users").exists() or platform.machine() not in ("x86_64", "aarch64"),
    reason="no kernel keys here, or no syscall numbers for this architecture",
)
REPO = REPO


def uid_range(size: int) -> tuple[int, int]:
    """A range of high uids, picked at random (other test runs on this host may use theirs), that no
    account has and nothing is left of (processes, keys, IPC objects, files in /tmp)."""
    taken = {entry.pw_uid for entry in pwd.getpwall()} | set(key_counts())
    while True:
        low = random.randrange(2_000_000, 2_000_000_000, 1000)
        if not any(uid in taken or leftovers_of(uid) for uid in range(low, low + size)):
            return low, low + size - 1


def as_uid(uid: int, *argv: str, **popen: Any) -> subprocess.Popen[str]:
    """Runs `argv` as `uid` (gid the same, no groups), as the agent's tasks do."""
    return subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv], text=True, **popen
    )


def python_as(uid: int, code: str) -> str:
    """Runs `code` in a system Python as `uid`; what it printed."""
    assert CHILD_PYTHON is not None
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            CHILD_PYTHON,
            "-I",
            "-S",
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / "run" / "mwms" / "task-uids"


@pytest.fixture
def stopper() -> Iterator[Callable[[subprocess.Popen[str]], subprocess.Popen[str]]]:
    """Kills the processes a test started, however it ended."""
    started: list[subprocess.Popen[str]] = []

    def keep(process: subprocess.Popen[str]) -> subprocess.Popen[str]:
        started.append(process)
        return process

    yield keep
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_two_agents_on_one_host_never_hand_out_the_same_uid(lock_dir: Path) -> None:
    low, high = uid_range(2)
    first, second = (TaskUsers(None, (low, high), lock_dir=lock_dir) for _ in range(2))
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o700 and lock_dir.stat().st_uid == 0
    a0, a1 = first.acquire("a-0", "jobA"), first.acquire("a-1", "jobA")
    b0 = second.acquire("b-0", "jobB")
    assert a0 == a1 and b0.uid != a0.uid and {a0.uid, b0.uid} == {low, high}
    with pytest.raises(TaskUserError, match="other agents on this host.*widen --task-uids"):
        second.acquire("c-0", "jobC")
    assert not first.sole_holder("a-1") and not first.release("a-0") and first.sole_holder("a-1")
    with pytest.raises(TaskUserError):
        second.acquire("c-0", "jobC")  # jobA's other task here still runs as it
    assert first.release("a-1")
    assert second.acquire("c-0", "jobC").uid == a0.uid
    with pytest.raises(TaskUserError):
        first.acquire("d-0", "jobD")


def test_a_uid_whose_lock_another_process_holds_is_skipped_until_that_process_ends(
    lock_dir: Path, stopper: Any, wait_for: Callable[..., Any]
) -> None:
    low, high = uid_range(1)
    users = TaskUsers(None, (low, high), lock_dir=lock_dir)
    hold = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
        "fcntl.flock(fd, fcntl.LOCK_EX); time.sleep(30)"
    )
    holder = stopper(subprocess.Popen([sys.executable, "-c", hold, str(lock_dir / str(low))], text=True))

    def locked() -> bool:
        fd = os.open(lock_dir / str(low), os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    wait_for(locked, "flock to take the uid's lock")
    with pytest.raises(TaskUserError, match="in use"):
        users.acquire("t-0", "job")
    holder.kill()
    holder.wait(timeout=10)  # the kernel drops a dead holder's flock
    assert users.acquire("t-0", "job").uid == low


def test_a_uid_a_process_still_runs_as_is_not_handed_on(
    lock_dir: Path, stopper: Any, wait_for: Callable[..., Any]
) -> None:
    low, high = uid_range(2)
    users = TaskUsers(None, (low, high), lock_dir=lock_dir)
    left = stopper(as_uid(low, "sleep", "30"))
    wait_for(lambda: low in task_users.processes_by_id(), "the process as the uid to start")
    assert users.acquire("t-0", "job0").uid == high  # the lowest, never used, but not clean
    with pytest.raises(TaskUserError):
        users.acquire("t-1", "job1")
    left.kill()
    left.wait(timeout=10)
    assert users.acquire("t-1", "job1").uid == low


def test_a_process_whose_real_uid_alone_is_the_task_uid_is_found_and_ended(
    lock_dir: Path, stopper: Any, wait_for: Callable[..., Any]
) -> None:
    """As a setuid program a task started runs: effective uid root, real uid the task's. Its /proc dir
    says root; its status lines say who started it."""
    low, high = uid_range(1)
    hidden = stopper(subprocess.Popen(["setpriv", f"--ruid={low}", "sleep", "30"], text=True))
    wait_for(lambda: low in task_users.processes_by_id(), "the process with the real uid to start")
    assert os.stat(f"/proc/{hidden.pid}").st_uid == 0
    with pytest.raises(TaskUserError):
        TaskUsers(None, (low, high), lock_dir=lock_dir).acquire("t-0", "job")
    assert end_processes_of(low) == 1
    assert hidden.wait(timeout=10) == -signal.SIGKILL
    assert TaskUsers(None, (low, high), lock_dir=lock_dir).acquire("t-0", "job").uid == low


def test_the_uid_released_longest_ago_is_handed_out_first_also_by_another_agent(lock_dir: Path) -> None:
    low, high = uid_range(3)
    first = TaskUsers(None, (low, high), lock_dir=lock_dir)
    assert first.acquire("x", "jx").uid == low
    first.release("x")
    assert first.acquire("y", "jy").uid == low + 1  # a never-used uid before a just-released one
    assert first.acquire("z", "jz").uid == low + 2
    assert first.acquire("w", "jw").uid == low  # none never-used left: the one released longest ago
    for task in ("y", "w", "z"):  # released in this order
        first.release(task)
    restarted = TaskUsers(None, (low, high), lock_dir=lock_dir)  # the order is in the lock files
    assert [restarted.acquire(t, t).uid for t in ("a", "b", "c")] == [low + 1, low, low + 2]


@needs_keys
@needs_child_python
def test_keys_a_uid_left_in_its_keyrings_are_cleared_before_it_is_handed_on(lock_dir: Path) -> None:
    low, high = uid_range(1)
    add_key = textwrap.dedent(
        """
        import ctypes, platform
        libc = ctypes.CDLL(None, use_errno=True)
        number = {"x86_64": 248, "aarch64": 217}[platform.machine()]
        serial = libc.syscall(number, b"user", b"mwms-test-secret", b"job A's", 7, ctypes.c_int(-4))
        assert serial > 0, ctypes.get_errno()
        """
    )
    python_as(low, add_key)
    assert key_counts().get(low, 0) >= 3  # its user and user-session keyrings, and the key, stay
    libc = ctypes.CDLL(None)
    dumpable = libc.prctl(3, 0, 0, 0, 0)
    users = TaskUsers(None, (low, high), lock_dir=lock_dir)
    assert users.acquire("t-0", "jobB").uid == low
    assert os.getresuid() == (0, 0, 0) and os.getresgid() == (0, 0, 0)
    assert libc.prctl(3, 0, 0, 0, 0) == dumpable
    assert key_counts().get(low, 0) <= 3  # its standard keyrings, empty
    assert "mwms-test-secret" not in python_as(low, "print(open('/proc/keys').read())")


@needs_keys
@needs_child_python
def test_a_uid_whose_keys_cannot_be_cleared_is_not_handed_on(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    low, high = uid_range(1)
    python_as(
        low,
        "import ctypes, platform; ctypes.CDLL(None).syscall({'x86_64': 248, 'aarch64': 217}[platform.machine()], "
        "b'user', b'mwms-test-kept', b'x', 1, ctypes.c_int(-4))",
    )
    with monkeypatch.context() as patched:
        patched.setattr(task_users, "_clear_keyrings_as", lambda uid: None)
        with pytest.raises(TaskUserError):
            TaskUsers(None, (low, high), lock_dir=lock_dir).acquire("t-0", "job")
    assert TaskUsers(None, (low, high), lock_dir=lock_dir).acquire("t-0", "job").uid == low  # cleared now


@needs_child_python
def test_a_sysv_ipc_object_a_uid_left_keeps_it_back(lock_dir: Path) -> None:
    low, high = uid_range(1)
    shmid = int(python_as(low, "import ctypes; print(ctypes.CDLL(None).shmget(0, 4096, 0o1600))"))
    assert shmid >= 0
    try:
        with pytest.raises(TaskUserError):
            TaskUsers(None, (low, high), lock_dir=lock_dir).acquire("t-0", "job")
    finally:
        subprocess.run(["ipcrm", "-m", str(shmid)], check=True)
    assert TaskUsers(None, (low, high), lock_dir=lock_dir).acquire("t-0", "job").uid == low


def test_files_a_uid_left_in_shared_temp_dirs_keep_it_back(lock_dir: Path, tmp_path: Path) -> None:
    low, high = uid_range(1)
    shared = tmp_path / "tmp"
    nested = shared / ".X11-unix"  # a world-writable dir of root's in it
    nested.mkdir(parents=True)
    shared.chmod(0o1777)
    nested.chmod(0o1777)
    left = [shared / "cache", nested / "X42"]
    for path in left:
        path.write_text("job A's")
        os.chown(path, low, low)
    users = TaskUsers(None, (low, high), lock_dir=lock_dir, shared_dirs=[shared])
    for path in left:
        with pytest.raises(TaskUserError):
            users.acquire("t-0", "job")
        path.unlink()
    assert users.acquire("t-0", "job").uid == low


def test_a_restarted_agent_takes_back_the_uid_of_a_task_its_dead_predecessor_left_running(
    lock_dir: Path, stopper: Any
) -> None:
    low, high = uid_range(2)
    agent = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from mwms.worker_agent.task_users import TaskUsers
        users = TaskUsers(None, ({low}, {high}), lock_dir={str(lock_dir)!r})
        uid = users.acquire("t-0", "job").uid
        task = subprocess.Popen(["setpriv", f"--reuid={{uid}}", f"--regid={{uid}}", "--clear-groups",
                                 "sleep", "30"], start_new_session=True)
        print(uid, task.pid, flush=True)
        time.sleep(60)
        """
    )
    dead = stopper(
        subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True, cwd=REPO)
    )
    assert dead.stdout is not None
    uid, task_pid = map(int, dead.stdout.readline().split())
    dead.kill()
    dead.wait(timeout=10)
    try:
        restarted = TaskUsers(None, (low, high), lock_dir=lock_dir)
        other = restarted.acquire("o-0", "other")
        assert other.uid != uid  # its lock went with the dead agent, but its task runs on as it
        with pytest.raises(TaskUserError):
            restarted.acquire("o-1", "third")
        assert TaskUsers(None, (low, high), lock_dir=lock_dir).adopt("x", "other", other.uid) is None
        adopted = restarted.adopt("t-0", "job", uid)
        assert adopted is not None and adopted.uid == uid
        assert restarted.acquire("t-1", "job") == adopted  # the job's next task here shares it
        assert restarted.adopt("t-2", "job", other.uid) is None  # another job's tasks run as that one
        assert TaskUsers(None, (low, high), lock_dir=lock_dir).adopt("t-0", "job", uid) is None
        assert end_processes_of(uid) == 1
        assert not restarted.release("t-0") and restarted.release("t-1")
    finally:
        try:
            os.kill(task_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
