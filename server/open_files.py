"""The coordinator's limit on open files: each agent's stream holds a descriptor for as long as the agent is
connected, on top of HTTP clients, log follows, the database pool and the files being uploaded.

Linux starts most processes with a soft limit of 1,024 (and a hard limit of 524,288 on current systemd
hosts): a coordinator of 1,000 agents would fail to accept connections ("Too many open files") long
before the hard limit. `raise_open_files_limit` lifts the soft limit to the hard one at start; under the
shipped unit (LimitNOFILE=65536, both limits) it is already there, and its system call filter refuses
setrlimit() anyway.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("mwms.server.open_files")

# What 1,000 agent streams plus the rest need, with room to spare.
WANTED_OPEN_FILES = 8192


def raise_open_files_limit(wanted: int = WANTED_OPEN_FILES) -> int:
    """Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the soft limit now in force and logs
    a warning when it stays below `wanted`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as error:
            log.info("could not raise the open files limit from %d to %d: %s", soft, target, error)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "this coordinator may open only %d files (hard limit %d), fewer than %d: each connected agent "
            "holds one, as do HTTP clients and log follows, so connections beyond the limit fail; raise it "
            "(LimitNOFILE=65536 in its systemd unit, or ulimit -n before starting it)",
            soft,
            hard,
            wanted,
        )
    return soft
