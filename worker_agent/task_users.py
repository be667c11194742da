"""Who a task runs as: never the agent's own user when the agent is root, never root.

An agent started as root gives each running task a uid of its own from a configured range (one per
concurrent job on this machine, with the gid of the same number and no supplementary groups), so two jobs'
tasks on one machine cannot read each other's `/proc/<pid>/environ`, files or memory, and none can read the
agent's. The running tasks of one job here share their uid, as they share their /dev/shm
(worker_agent/job_shares.py): NCCL's shared memory files between them are readable by their owner alone.
With `--task-user` every task runs as that one unprivileged account instead. An agent that is not root
cannot change identity: its tasks share its uid, which it says at start and in its registration.
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
from dataclasses import dataclass

log = logging.getLogger("mwms.agent.task_users")

# How many uids of a range are checked against the account database at start (a wider range is
# checked lazily, each uid when it is first handed out).
CHECKED_AT_START = 4096


class TaskUserError(Exception):
    """The configured task user or uid range cannot be used; the message says what to change."""


@dataclass(frozen=True)
class TaskIdentity:
    """The uid and gid one task runs as; `shared` when that is the agent's own identity."""

    uid: int
    gid: int
    name: str
    shared: bool = False


class TaskUsers:
    """Hands out task identities: a uid per running task from a range, one fixed user, or the agent's own."""

    def __init__(
        self, task_user: str | None, uid_range: tuple[int, int], agent_uid: int | None = None
    ) -> None:
        self._agent_uid = os.geteuid() if agent_uid is None else agent_uid
        self._lock = threading.Lock()
        self._in_use: dict[str, int] = {}
        self._job_of: dict[str, str] = {}
        self._fixed: TaskIdentity | None = None
        self._low, self._high = uid_range
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
        return f"each task runs as a uid of its own from {self._low}-{self._high}"

    def acquire(self, task_id: str, job_id: str = "") -> TaskIdentity:
        """The identity `task_id` runs as; the same one again for a task that already holds one. The
        running tasks of one job (`job_id`) share a uid: they share their /dev/shm, whose files NCCL makes
        readable by their owner alone (worker_agent/job_shares.py)."""
        if self._fixed is not None:
            return self._fixed
        with self._lock:
            held = self._in_use.get(task_id)
            if held is None:
                held = self._uid_of_job(job_id) if job_id else None
                if held is None:
                    held = self._free_uid()
                self._in_use[task_id] = held
                self._job_of[task_id] = job_id
        return TaskIdentity(held, held, f"uid {held}")

    def release(self, task_id: str) -> bool:
        """Gives the task's uid back once none of its processes can be left (the task has ended); True when
        no other task holds that uid now (its job's other tasks here may)."""
        with self._lock:
            uid = self._in_use.pop(task_id, None)
            self._job_of.pop(task_id, None)
            return uid is None or uid not in self._in_use.values()

    def sole_holder(self, task_id: str) -> bool:
        """Whether no other task holds `task_id`'s uid (its job's other tasks here share it)."""
        with self._lock:
            uid = self._in_use.get(task_id)
            return uid is None or sum(held == uid for held in self._in_use.values()) == 1

    def _uid_of_job(self, job_id: str) -> int | None:
        for task_id, job in self._job_of.items():
            if job == job_id and task_id in self._in_use:
                return self._in_use[task_id]
        return None

    def _free_uid(self) -> int:
        taken = set(self._in_use.values())
        for uid in range(self._low, self._high + 1):
            if uid in taken:
                continue
            if uid - self._low >= CHECKED_AT_START and _is_account(uid):
                continue
            return uid
        raise TaskUserError(
            f"all {self._high - self._low + 1} task uids of {self._low}-{self._high} are in use; "
            "widen --task-uids"
        )


def end_processes_of(uid: int) -> int:
    """SIGKILLs every process running as `uid` (a task's own uid, after the task ended); returns how many.

    Without a sandbox a task's process may leave its process group (setsid) to outlive the task: its
    uid still gives it away.
    """
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid != uid:
                continue
            os.kill(int(entry.name), 9)
            killed += 1
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    if killed:
        log.warning("ended %d process(es) left running as task uid %d", killed, uid)
    return killed


def _account_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _is_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _resolve_user(task_user: str) -> TaskIdentity:
    """`task_user` (a name or a uid) as an identity; root and unknown names are refused."""
    try:
        entry = pwd.getpwuid(int(task_user)) if task_user.isdigit() else pwd.getpwnam(task_user)
    except KeyError:
        if task_user.isdigit():  # a bare uid with no account is fine: it owns nothing but its task's files
            uid = int(task_user)
            if uid == 0:
                raise TaskUserError("--task-user 0 is root: give an unprivileged user") from None
            return TaskIdentity(uid, uid, f"uid {uid}")
        raise TaskUserError(
            f"--task-user {task_user!r} is no account on this machine; create it (e.g. "
            f"`useradd --system --no-create-home {task_user}`) or give a uid"
        ) from None
    if entry.pw_uid == 0:
        raise TaskUserError(f"--task-user {task_user!r} is root: give an unprivileged user")
    return TaskIdentity(entry.pw_uid, entry.pw_gid, entry.pw_name)


def _check_range(low: int, high: int) -> None:
    """Refuses a uid range that holds root or an existing account (a task would act as that account)."""
    if low < 1 or high < low:
        raise TaskUserError(f"--task-uids {low}-{high} is not a range of unprivileged uids")
    for uid in range(low, min(high, low + CHECKED_AT_START - 1) + 1):
        if _is_account(uid):
            raise TaskUserError(
                f"--task-uids {low}-{high} holds uid {uid}, the account {_account_name(uid)!r}: a task "
                "would run as that account; pick a range of unused uids"
            )
