"""The agent's work dir: its credential, bundle cache, state file, outboxes and the tasks' own directories.

Tasks run programs written by strangers, so what the agent keeps for itself must be out of their reach:
the work dir is the agent's alone (mode 0700; an existing one that others may list or write is tightened,
with a warning, as credentials.py does for the credential file). A task reaches its own directory under
`jobs/` through the sandbox's bind mount or, without a sandbox, through a work dir that others may only
traverse (`traversable`: mode 0711, no listing); the agent's secrets are then private on their own
(agent-credential 0600, bundles/ 0700 with files 0600).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import stat
from pathlib import Path
from typing import IO

log = logging.getLogger("mwms.agent.work_dir")

BUNDLES_DIR = "bundles"
JOBS_DIR = "jobs"
OUTBOX_DIR = "outbox"
LOCK_FILE = "agent.lock"
MAX_LOCK_NOTE_BYTES = 4096
PRIVATE_MODE = 0o700
TRAVERSE_ONLY_MODE = 0o711


def prepare_work_dir(path: Path, *, traversable: bool = False) -> None:
    """Creates `path` (mode 0700, or 0711 when `traversable`) or restricts an existing one to that mode."""
    wanted = TRAVERSE_ONLY_MODE if traversable else PRIVATE_MODE
    path.mkdir(mode=wanted, parents=True, exist_ok=True)  # parents: the umask's mode, they are not ours
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        log.warning(
            "the work dir %s belongs to uid %d, not to the agent (uid %d): that user can read and replace "
            "the agent's credential and files; give the agent a work dir of its own",
            path,
            info.st_uid,
            os.geteuid(),
        )
    if mode == wanted:
        return
    if mode & (stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH):
        log.warning(
            "the work dir %s (mode %04o) can be listed or written by other users; restricting it to "
            "its owner (mode %04o)",
            path,
            mode,
            wanted,
        )
    os.chmod(path, wanted)


class WorkDirInUse(Exception):
    """Another agent process holds the work dir."""


def lock_work_dir(path: Path, name: str) -> IO[str]:
    """Takes the work dir for this process (an flock on <path>/agent.lock, released by the kernel when the
    process ends, however it ends) and notes who holds it; WorkDirInUse naming the holder otherwise. Two
    agents on one work dir would overwrite each other's credential and task state. Keep the returned
    file open for as long as the agent runs."""
    lock_path = path / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    lock = os.fdopen(fd, "r+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(lock)
        lock.close()
        raise WorkDirInUse(
            f"the work dir {path} is in use by {holder}: two agents on one work dir overwrite each other's "
            "credential; give this agent a --work-dir of its own (or stop the other one)"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps({"pid": os.getpid(), "name": name, "host": socket.gethostname()}) + "\n")
    lock.flush()
    return lock


def _holder(lock: IO[str]) -> str:
    try:
        note = json.loads(lock.read(MAX_LOCK_NOTE_BYTES) or "{}")
        host = f" on {str(note['host'])[:200]}" if note.get("host") else ""
        return f"agent {str(note['name'])[:200]!r} (pid {int(note['pid'])}{host})"
    except (ValueError, KeyError, TypeError):
        return "another agent process"
