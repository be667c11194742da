"""Who a task may run as: its identity (uid, gid), and the checks of a configured `--task-user` or
`--task-uids` range against the account database (worker_agent/task_users.py hands the identities out)."""

from __future__ import annotations

import pwd
from dataclasses import dataclass

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
