"""INFO lines for the changes operators alert on, written once the transaction that made them commits.

Job and attempt state changes, agents lost, back or removed, whole-gang restarts and preemptions each log
one line on the `mwms.server.events` logger, with their ids as fields (`event`, `job_id`, `attempt`,
`state`, `agent`, ...): `--log-format json` writes them as keys of the line (mwms/log_setup.py). The line
is held with the session (mwms.server.observability.on_commit), so a decision that rolls back logs nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from mwms.server.observability.on_commit import on_commit

log = logging.getLogger("mwms.server.events")
# A reason is logged up to its first line (a failure's reason goes on with the task's last log lines,
# which are the job's own output and stay in the job's events) and this many characters.
MAX_REASON_CHARS = 300


def log_after_commit(session: Session | None, message: str, **fields: Any) -> None:
    """Logs `message` at INFO with `fields` as extra once `session` commits (at once without a session)."""
    if session is None:
        log.info(message, extra=fields)
        return
    on_commit(session, lambda: log.info(message, extra=fields))


def reason_summary(reason: str) -> str:
    """The first line of `reason`, cut to MAX_REASON_CHARS."""
    first = reason.split("\n", 1)[0]
    return first if len(first) <= MAX_REASON_CHARS else first[: MAX_REASON_CHARS - 3] + "..."
