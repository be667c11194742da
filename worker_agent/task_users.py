"""Who a task runs as: never the agent's own user when the agent is root, never root.

An agent started as root gives each running task a uid of its own from a configured range (one per
concurrent job on this machine, with the gid of the same number and no supplementary groups), so two jobs'
tasks on one machine cannot read each other's `/proc/<pid>/environ`, files or memory, and none can read the
agent's. The running tasks of one job here share their uid, as they share their /dev/shm
(worker_agent/job_shares.py): NCCL's shared memory files between them are readable by their owner alone.
With `--task-user` every task runs as that one unprivileged account instead. An agent that is not root
cannot change identity: its tasks share its uid, which it says at start and in its registration.

Task uids are unique on the host, across every agent on it: a uid is held through an flock on its file in
`/run/mwms/task-uids/` (root's, 0700), which the holding agent keeps open while a task of its own runs as
it. The kernel drops the lock when that agent ends, however it ends, so a crashed agent holds nothing,
and two agents on one machine with the same --task-uids never hand one uid to two jobs.

A uid is never handed on while anything of its last holder could remain. Before handing one out the agent
checks that no process runs as it (any of its real, effective, saved or filesystem uid or gid), that no
SysV IPC object and no entry of the shared temp dirs (/tmp, /var/tmp, /dev/shm, /dev/mqueue) belongs to
it, and it empties the uid's kernel keyrings: since Linux 5.3 a uid's user and user-session keyrings
live as long as its user namespace (for a host uid, until reboot), not as long as its processes, so keys
a task put there would reach the next job of that uid. A uid with anything left is skipped (and said in
the log); so is one whose keys could not be cleared. Of the uids that pass, the one released longest ago
goes first (never-used ones before any), so a freshly released uid rests; the release time is written
into its lock file, so rotation holds across agents and agent restarts (/run is emptied at reboot, with
the kernel's state).

The checks of a configured user or range are worker_agent/task_identity.py's; what a uid leaves on the
host, and clearing it, worker_agent/task_uid_leftovers.py's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

from mwms.worker_agent.task_identity import (
    CHECKED_AT_START,
    _account_name,
    _check_range,
    _is_account,
    _resolve_user,
)
from mwms.worker_agent.task_identity import TaskIdentity as TaskIdentity
from mwms.worker_agent.task_identity import TaskUserError as TaskUserError
from mwms.worker_agent.task_uid_leftovers import SHARED_DIRS, _HostResidue
from mwms.worker_agent.task_uid_leftovers import _clear_keyrings_as as _clear_keyrings_as
from mwms.worker_agent.task_uid_leftovers import end_processes_of as end_processes_of
from mwms.worker_agent.task_uid_leftovers import key_counts as key_counts
from mwms.worker_agent.task_uid_leftovers import leftovers_of as leftovers_of
from mwms.worker_agent.task_uid_leftovers import processes_by_id as processes_by_id

log = logging.getLogger("mwms.agent.task_users")

# Where every agent on the host holds its tasks' uids: one lock file per uid (named by the uid).
LOCK_DIR = Path("/run/mwms/task-uids")
# How long the kernel is given to collect the keys a clearing unlinked, and how long a uid whose keys
# stayed is left alone before it is tried again.
KEY_GC_WAIT_S = 2.0
KEY_RETRY_S = 60.0
# A logged reason to skip a uid is not repeated for that uid within this many seconds.
SKIP_LOG_INTERVAL_S = 300.0

_RELEASED = b"released "


class TaskUsers:
    """Hands out task identities: a uid per running job from a range (held host-wide), one fixed user, or
    the agent's own."""

    def __init__(
        self,
        task_user: str | None,
        uid_range: tuple[int, int],
        agent_uid: int | None = None,
        *,
        lock_dir: str | os.PathLike[str] = LOCK_DIR,
        shared_dirs: Sequence[str | os.PathLike[str]] = SHARED_DIRS,
    ) -> None:
        self._agent_uid = os.geteuid() if agent_uid is None else agent_uid
        self._lock = threading.Lock()
        self._in_use: dict[str, int] = {}
        self._job_of: dict[str, str] = {}
        self._fixed: TaskIdentity | None = None
        self._low, self._high = uid_range
        self._lock_dir = Path(lock_dir)
        self._shared_dirs = [Path(directory) for directory in shared_dirs]
        # uid -> the open lock file whose flock holds it; closed (unlocking it) when the object goes.
        self._held: dict[int, int] = {}
        self._closer = weakref.finalize(self, _close_all, self._held)
        self._keys_retry_at: dict[int, float] = {}
        self._skip_logged: dict[int, tuple[str, float]] = {}
        if self._agent_uid != 0:
            if task_user:
                raise TaskUserError(
                    f"--task-user {task_user!r} needs an agent started as root (this one runs as uid "
                    f"{self._agent_uid}); start it as root, or drop --task-user"
                )
            self._fixed = TaskIdentity(
                self._agent_uid, os.getegid(), _account_name(self._agent_uid), shared=True
            )
        elif task_user:
            self._fixed = _resolve_user(task_user)
        else:
            _check_range(self._low, self._high)
            _prepare_lock_dir(self._lock_dir)

    @classmethod
    def agents_own(cls) -> TaskUsers:
        """Tasks run as the agent's own user, whoever that is (tests of the agent's bookkeeping)."""
        users = cls(None, (1, 1), agent_uid=1)
        users._agent_uid = os.geteuid()
        users._fixed = TaskIdentity(os.geteuid(), os.getegid(), _account_name(os.geteuid()), shared=True)
        return users

    @property
    def shared_with_agent(self) -> bool:
        """True when tasks run as the agent's own user (an agent that is not root)."""
        return self._fixed is not None and self._fixed.shared

    @property
    def per_task(self) -> bool:
        """True when each task has a uid of its own (what runs as it belongs to that task alone)."""
        return self._fixed is None

    def describe(self) -> str:
        """One line for the log and the agent list: who tasks run as."""
        if self._fixed is not None and self._fixed.shared:
            return (
                f"tasks run as the agent's own user ({self._fixed.name}, uid {self._fixed.uid}): a job can "
                "read and signal whatever this user can, the agent's files included; start the agent as "
                "root to give each task a user of its own"
            )
        if self._fixed is not None:
            return f"tasks run as {self._fixed.name} (uid {self._fixed.uid})"
        return (
            f"each task runs as a uid of its own from {self._low}-{self._high} "
            f"(held host-wide in {self._lock_dir})"
        )

    def acquire(self, task_id: str, job_id: str = "") -> TaskIdentity:
        """The identity `task_id` runs as; the same one again for a task that already holds one. The
        running tasks of one job (`job_id`) share a uid: they share their /dev/shm, whose files NCCL makes
        readable by their owner alone (worker_agent/job_shares.py). A new uid is one no agent on the host
        holds and nothing of its last holder is left of (the module's docstring)."""
        if self._fixed is not None:
            return self._fixed
        with self._lock:
            held = self._in_use.get(task_id)
            if held is None:
                held = self._uid_of_job(job_id) if job_id else None
                if held is None:
                    held = self._claim_free_uid()
                self._in_use[task_id] = held
                self._job_of[task_id] = job_id
        return TaskIdentity(held, held, f"uid {held}")

    def adopt(self, task_id: str, job_id: str, uid: int) -> TaskIdentity | None:
        """Takes back `uid` for `task_id`, a task a previous agent process on this work dir ran as `uid`
        (its lock went with that process), without the check that nothing runs as it: what may still run
        as it is that task's own, for the caller to stop (`end_processes_of`) before it `release`s it.
        None when someone else holds the uid now, another agent or another job's task here (then nothing
        of the task's is left as that uid: it was only handed on once nothing was), or it is outside the
        range; the caller must then leave that uid's processes alone."""
        if self._fixed is not None:
            return self._fixed
        if not self._low <= uid <= self._high:
            return None
        with self._lock:
            held = self._in_use.get(task_id)
            if held is not None:
                return TaskIdentity(held, held, f"uid {held}") if held == uid else None
            if uid in self._held:
                holders = [task for task, number in self._in_use.items() if number == uid]
                if any(self._job_of.get(task) != job_id for task in holders):
                    return None  # another job's tasks here run as it now
            else:
                fd = self._try_lock(uid)
                if fd is None:
                    return None
                self._note_holder(fd, uid)
                self._held[uid] = fd
            self._in_use[task_id] = uid
            self._job_of[task_id] = job_id
        return TaskIdentity(uid, uid, f"uid {uid}")

    def transfer(self, holder: str, task_id: str, job_id: str) -> TaskIdentity:
        """Passes the identity `holder` holds (a warm interpreter's, worker_agent/warm_pool.py) to the task
        `task_id` of job `job_id`, which its processes then run as: the uid stays locked throughout."""
        if self._fixed is not None:
            return self._fixed
        with self._lock:
            uid = self._in_use.pop(holder)
            self._job_of.pop(holder, None)
            self._in_use[task_id] = uid
            self._job_of[task_id] = job_id
        return TaskIdentity(uid, uid, f"uid {uid}")

    def release(self, task_id: str) -> bool:
        """Gives the task's uid back once none of its processes can be left (the task has ended); True when
        no other task holds that uid now (its job's other tasks here may)."""
        with self._lock:
            uid = self._in_use.pop(task_id, None)
            self._job_of.pop(task_id, None)
            if uid is None:
                return True
            if uid in self._in_use.values():
                return False
            fd = self._held.pop(uid, None)
            if fd is not None:
                _unlock(fd, stamp=True)
            return True

    def sole_holder(self, task_id: str) -> bool:
        """Whether no other task holds `task_id`'s uid (its job's other tasks here share it)."""
        with self._lock:
            uid = self._in_use.get(task_id)
            return uid is None or sum(held == uid for held in self._in_use.values()) == 1

    def close(self) -> None:
        """Gives back every uid this object holds (marked released now); an agent's end does it too."""
        with self._lock:
            self._in_use.clear()
            self._job_of.clear()
            for uid in list(self._held):
                _unlock(self._held.pop(uid), stamp=True)

    def _uid_of_job(self, job_id: str) -> int | None:
        for task_id, job in self._job_of.items():
            if job == job_id and task_id in self._in_use:
                return self._in_use[task_id]
        return None

    def _claim_free_uid(self) -> int:
        """Locks and returns the free uid released longest ago (never-used ones first)."""
        residue = _HostResidue(self._shared_dirs)
        for uid in self._candidates():
            if uid - self._low >= CHECKED_AT_START and _is_account(uid):
                continue
            fd = self._try_lock(uid)
            if fd is None:
                continue  # another agent (or another TaskUsers of this one) holds it
            reason = residue.of(uid) or self._keys_left(uid)
            if reason:
                _unlock(fd, stamp=False)
                self._log_skip(uid, reason)
                continue
            self._note_holder(fd, uid)
            self._held[uid] = fd
            return uid
        raise TaskUserError(
            f"all {self._high - self._low + 1} task uids of {self._low}-{self._high} are in use (by tasks "
            "of this agent or of other agents on this host, or still holding processes, IPC objects, keys "
            "or files of their last tasks: see the log); widen --task-uids"
        )

    def _candidates(self) -> Iterator[int]:
        """The uids of the range no task of this object holds: never-used ones first, lowest first, then
        those with a lock file, released longest ago first (one whose release is unknown, its holder
        having died, last)."""
        order: dict[int, tuple[int, float]] = {}
        try:
            entries = list(os.scandir(self._lock_dir))
        except OSError:
            entries = []
        for entry in entries:
            if not entry.name.isdigit():
                continue
            uid = int(entry.name)
            if self._low <= uid <= self._high and uid not in self._held:
                order[uid] = _release_order(entry)
        for uid in range(self._low, self._high + 1):
            if uid not in order and uid not in self._held:
                yield uid
        yield from sorted(order, key=lambda uid: (order[uid], uid))

    def _try_lock(self, uid: int) -> int | None:
        """The uid's lock file, flocked by this open file description; None when someone holds it."""
        try:
            fd = os.open(
                self._lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except OSError as error:
            log.warning("cannot open the lock file of task uid %d in %s: %s", uid, self._lock_dir, error)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def _note_holder(fd: int, uid: int) -> None:
        _rewrite(fd, f"held by pid {os.getpid()} since {time.time():.3f}\n".encode())

    def _keys_left(self, uid: int) -> str:
        """Empties the uid's keyrings when it owns keys; why it cannot be handed on, "" when it can."""
        counts = key_counts()
        if not counts.get(uid):
            return ""
        if time.monotonic() < self._keys_retry_at.get(uid, 0.0):
            return f"it still owns {counts[uid]} kernel key(s) that could not be cleared"
        standard = _clear_keyrings_as(uid)  # this module's name: a test replaces it here
        if standard is not None:
            deadline = time.monotonic() + KEY_GC_WAIT_S
            while key_counts().get(uid, 0) > standard and time.monotonic() < deadline:
                time.sleep(0.02)
            if key_counts().get(uid, 0) <= standard:
                self._keys_retry_at.pop(uid, None)
                log.info("cleared the kernel keyrings task uid %d's last holder left", uid)
                return ""
        self._keys_retry_at[uid] = time.monotonic() + KEY_RETRY_S
        return f"it still owns {key_counts().get(uid, 0)} kernel key(s) that could not be cleared"

    def _log_skip(self, uid: int, reason: str) -> None:
        kind = "".join(char for char in reason if not char.isdigit())  # counts aside
        now = time.monotonic()
        last = self._skip_logged.get(uid)
        if last is not None and last[0] == kind and now - last[1] < SKIP_LOG_INTERVAL_S:
            return
        self._skip_logged[uid] = (kind, now)
        log.warning("task uid %d is not handed on: %s", uid, reason)


def _release_order(entry: os.DirEntry[str]) -> tuple[int, float]:
    """Sort key of a lock file: (1, time) when released at `time`, (2, mtime) when its holder died."""
    try:
        with open(entry.path, "rb") as file:
            content = file.read(256)
        if content.startswith(_RELEASED):
            return 1, float(content[len(_RELEASED) :].split()[0])
        return 2, entry.stat(follow_symlinks=False).st_mtime
    except (OSError, ValueError, IndexError):
        return 2, time.time()


def _rewrite(fd: int, content: bytes) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, content, 0)
    except OSError as error:
        log.warning("cannot write a task uid's lock file: %s", error)


def _unlock(fd: int, *, stamp: bool) -> None:
    """Ends the hold (closing the file drops its flock); `stamp` notes the release time first."""
    if stamp:
        _rewrite(fd, _RELEASED + f"{time.time():.6f}\n".encode())
    os.close(fd)


def _close_all(held: dict[int, int]) -> None:
    for fd in held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    held.clear()


def _prepare_lock_dir(path: Path) -> None:
    """Creates the host-wide lock dir (root's, 0700) or checks an existing one is the agent's alone."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as error:
        raise TaskUserError(
            f"cannot create {path}, where the agents on this host hold their task uids: {error}"
        ) from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise TaskUserError(
            f"{path}, where the agents on this host hold their task uids, is not a directory of uid "
            f"{os.geteuid()}; remove it (the agent makes it again)"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
