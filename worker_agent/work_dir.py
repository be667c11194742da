"""The agent's work dir: its credential, bundle cache, state file, outboxes and the tasks' own directories.

Tasks run programs written by strangers, so what the agent keeps for itself must be out of their reach:
the work dir is the agent's alone (mode 0700; an existing one that others may list or write is tightened,
with a warning, as credentials.py does for the credential file). A task reaches its own directory under
`jobs/` through the sandbox's bind mount or, without a sandbox, through a work dir that others may only
traverse (`traversable`: mode 0711, no listing); the agent's secrets are then private on their own
(agent-credential 0600, bundles/ 0700 with files 0600).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("mwms.agent.work_dir")

BUNDLES_DIR = "bundles"
JOBS_DIR = "jobs"
OUTBOX_DIR = "outbox"
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
