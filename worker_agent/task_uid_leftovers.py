"""What a task uid leaves on the host, and clearing it: processes running as it, SysV IPC objects and
files in the shared temp dirs it owns, and its kernel keys (emptied from a thread that takes the uid).
worker_agent/task_users.py hands a uid on only once none is left (its docstring says why)."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger("mwms.agent.task_users")

# World-writable directories where a task without a sandbox may leave files (a sandbox gives each task
# private ones): an entry owned by a uid keeps the uid from being handed on.
SHARED_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")
# How deep world-writable directories inside SHARED_DIRS (/tmp/.X11-unix) are looked into.
SHARED_DIR_DEPTH = 2

# keyctl(2) operations and special keyring ids (linux/keyctl.h).
_KEYCTL_GET_KEYRING_ID = 0
_KEYCTL_SETPERM = 5
_KEYCTL_CLEAR = 7
_KEYCTL_LINK = 8
_KEYCTL_UNLINK = 9
_KEYCTL_GET_PERSISTENT = 22
_KEY_SPEC_USER_KEYRING = -4
_KEY_SPEC_USER_SESSION_KEYRING = -5
# The kernel's own permissions of a user keyring: possessor all but setattr, owner all.
_USER_KEYRING_PERM = 0x1F3F0000
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
# Raw syscall numbers (setgroups, setresgid, setresuid, keyctl): glibc's wrappers change every thread
# of the process, the raw calls only the calling one.
_SYSCALLS = {"x86_64": (116, 119, 117, 250), "aarch64": (159, 149, 147, 219)}
_CLEARING = threading.Lock()


class _HostResidue:
    """What is left on the host of each uid, each kind looked up once (when first needed) per claim."""

    def __init__(self, shared_dirs: Iterable[Path]) -> None:
        self._shared_dirs = list(shared_dirs)
        self._processes: dict[int, int] | None = None
        self._ipc: dict[int, int] | None = None
        self._files: dict[int, Path] | None = None

    def of(self, uid: int) -> str:
        """Why `uid` is not clean (processes, IPC objects or files of it), "" when nothing is left."""
        if self._processes is None:
            self._processes = processes_by_id()
        if uid in self._processes:
            return f"{self._processes[uid]} process(es) still run as it"
        if self._ipc is None:
            self._ipc = ipc_objects_by_id()
        if uid in self._ipc:
            return f"it still owns {self._ipc[uid]} SysV IPC object(s) (ipcs)"
        if self._files is None:
            self._files = shared_files_by_id(self._shared_dirs)
        if uid in self._files:
            return f"files of it are left in shared temp dirs ({self._files[uid]})"
        return ""


def leftovers_of(uid: int, shared_dirs: Iterable[str | os.PathLike[str]] = SHARED_DIRS) -> str:
    """What keeps `uid` from being handed on besides keys (which a claim clears): processes running as
    it, SysV IPC objects or files in `shared_dirs` of it; "" when there are none."""
    return _HostResidue(Path(directory) for directory in shared_dirs).of(uid)


def processes_by_id() -> dict[int, int]:
    """How many live processes (zombies aside) hold each uid or gid as their real, effective, saved or
    filesystem id. The status lines count, not /proc/<pid>'s owner: that is root for a process that made
    itself undumpable."""
    counts: dict[int, int] = {}
    for pid in _pids():
        ids = _process_ids(pid)
        for number in ids:
            counts[number] = counts.get(number, 0) + 1
    return counts


def ipc_objects_by_id() -> dict[int, int]:
    """How many SysV shared memory segments, semaphore sets and message queues each uid or gid owns or
    created (/proc/sysvipc, this IPC namespace: a sandbox gives each job its own, gone with it)."""
    counts: dict[int, int] = {}
    for kind in ("shm", "sem", "msg"):
        try:
            lines = Path("/proc/sysvipc", kind).read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        header = lines[0].split()
        columns = [header.index(name) for name in ("uid", "gid", "cuid", "cgid") if name in header]
        for line in lines[1:]:
            fields = line.split()
            ids = {int(fields[column]) for column in columns if column < len(fields)}
            for number in ids:
                counts[number] = counts.get(number, 0) + 1
    return counts


def shared_files_by_id(shared_dirs: Iterable[Path]) -> dict[int, Path]:
    """One entry of `shared_dirs` (and of world-writable directories in them) per uid or gid owning any."""
    found: dict[int, Path] = {}

    def scan(directory: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            for number in (info.st_uid, info.st_gid):
                found.setdefault(number, Path(entry.path))
            if depth > 1 and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH:
                scan(Path(entry.path), depth - 1)

    for directory in shared_dirs:
        scan(directory, SHARED_DIR_DEPTH)
    return found


def key_counts() -> dict[int, int]:
    """How many kernel keys each uid owns (/proc/key-users: "uid: usage nkeys/nikeys ..."); empty where
    the kernel has no keys."""
    counts: dict[int, int] = {}
    try:
        lines = Path("/proc/key-users").read_text().splitlines()
    except OSError:
        return counts
    for line in lines:
        fields = line.replace(":", " ", 1).split()
        try:
            counts[int(fields[0])] = int(fields[2].split("/")[0])
        except (IndexError, ValueError):
            continue
    return counts


def _clear_keyrings_as(uid: int) -> int | None:
    """Empties `uid`'s user and user-session keyrings (relinking the one into the other, as the kernel
    makes them) and its persistent keyring, from a thread that takes `uid` for itself alone (raw syscalls
    change the calling thread's credentials only) and then ends; another uid's keyrings cannot be reached
    otherwise, not even by root. Returns how many of those standard keyrings the uid now has, which stay;
    None when clearing is not possible here (not root, another architecture) or failed."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None or os.geteuid() != 0:
        return None
    setgroups, setresgid, setresuid, keyctl = numbers
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    arg = ctypes.c_long
    outcome: list[int | str] = []

    def call(*args: int) -> int:
        result = int(syscall(*(arg(value) for value in args)))
        if result < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return result

    def clear(keyring: int) -> None:
        try:
            call(keyctl, _KEYCTL_CLEAR, keyring)
        except OSError as error:
            if error.errno != errno.EACCES:
                raise
            call(keyctl, _KEYCTL_SETPERM, keyring, _USER_KEYRING_PERM)  # a task took its own write away
            call(keyctl, _KEYCTL_CLEAR, keyring)

    def as_uid() -> None:
        try:
            # This thread only, and for good: it ends right after.
            call(setgroups, 0, 0)
            call(setresgid, uid, uid, uid)
            call(setresuid, uid, uid, uid)
            user = call(keyctl, _KEYCTL_GET_KEYRING_ID, _KEY_SPEC_USER_KEYRING, 1)
            session = call(keyctl, _KEYCTL_GET_KEYRING_ID, _KEY_SPEC_USER_SESSION_KEYRING, 1)
            clear(user)
            clear(session)
            call(keyctl, _KEYCTL_LINK, user, session)
            standard = 2
            try:
                persistent = call(keyctl, _KEYCTL_GET_PERSISTENT, -1, user)
            except OSError as error:
                if error.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
            else:
                clear(persistent)
                call(keyctl, _KEYCTL_UNLINK, persistent, user)
                standard = 3
            outcome.append(standard)
        except OSError as error:
            outcome.append(str(error))

    # A change of credentials makes the whole process undumpable; give it back what it had (one clearing
    # at a time, so none restores what another's switch set).
    with _CLEARING:
        dumpable = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
        worker = threading.Thread(target=as_uid, name=f"keys-of-{uid}", daemon=True)
        worker.start()
        worker.join()
        if dumpable >= 0:
            libc.prctl(_PR_SET_DUMPABLE, dumpable, 0, 0, 0)
    if outcome and isinstance(outcome[0], int):
        return outcome[0]
    log.warning("could not clear the kernel keyrings of task uid %d: %s", uid, outcome or "no outcome")
    return None


def end_processes_of(uid: int) -> int:
    """SIGKILLs every process running as `uid` (a task's own uid, after the task ended); returns how many.

    Without a sandbox a task's process may leave its process group (setsid) to outlive the task: its
    uid still gives it away. Any of its uids counts (an undumpable process's /proc dir is root's).
    """
    killed = 0
    for pid in _pids():
        try:
            if uid not in _process_ids(pid, uids_only=True):
                continue
            os.kill(pid, 9)
            killed += 1
        except (ProcessLookupError, PermissionError):
            continue
    if killed:
        log.warning("ended %d process(es) left running as task uid %d", killed, uid)
    return killed


def _pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def _process_ids(pid: int, uids_only: bool = False) -> set[int]:
    """The uids (and gids) of a live process from its status lines; empty for a zombie or one gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    ids: set[int] = set()
    zombie = False
    threads = 1
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == "State":
            zombie = value.split()[:1] in (["Z"], ["X"])
        elif name == "Threads":
            threads = int(value) if value.strip().isdigit() else 1
        elif name == "Uid" or (name == "Gid" and not uids_only):
            ids.update(int(number) for number in value.split())
    # A dead leader's threads may live on: the process is a zombie only when none do.
    return set() if zombie and threads <= 1 else ids
