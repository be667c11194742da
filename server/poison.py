"""Poison containment: the one counter of bad rows and messages that a loop or stream skipped or refused.

Every loop that serves everyone (the reconciler, the scheduler, an agent's stream and its dispatcher)
handles each job, agent and message on its own: one that cannot be handled is logged, counted here and
skipped or refused with a reason, never re-raised into the loop. Exposed on /metrics as
``mwms_poison_total{kind=...}``; a `kind` names what was bad (``metric_point``, ``log_line``,
``reconcile_job``, ``schedule_job``, ``start_task``, ...).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.orm import Session

POISON = Counter(
    "mwms_poison",
    "Bad rows and messages that a coordinator loop or agent stream skipped or refused (by kind)",
    ["kind"],
)
# Every kind the coordinator counts, each at 0 from the start: a dashboard shows 0 rather than "No data",
# and increase() in an alert sees the first bad item (tests/system/deploy/test_alert_rules.py finds every kind the
# code names and holds this list to it). `agent_<body>` is a stream message of that body that could not
# be applied (server/rpc/agent_stream.py); heartbeats are answered on the reader and never refused.
KNOWN_KINDS = (
    "agent_capacity",
    "agent_devices",
    "agent_goodbye",
    "agent_hello",
    "agent_logs",
    "agent_metrics",
    "agent_preflight",
    "agent_stacks",
    "agent_task",
    "device_sample",
    "fair_share",
    "log_line",
    "metric_point",
    "preempt_job",
    "reconcile_agent",
    "reconcile_job",
    "restart_job",
    "schedule_job",
    "start_task",
    "task_report",
)
for _kind in KNOWN_KINDS:
    POISON.labels(kind=_kind)

_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()
_MAX_LOGGED = 10_000


def count_poison(kind: str) -> None:
    """Counts one bad row or message of `kind`."""
    POISON.labels(kind=kind).inc()


def first_time(kind: str, key: str) -> bool:
    """True the first time (`kind`, `key`) is seen in this process: a loop that meets the same bad row on
    every pass logs its traceback once, then a one-line warning."""
    with _logged_lock:
        if (kind, key) in _logged:
            return False
        if len(_logged) < _MAX_LOGGED:
            _logged.add((kind, key))
        return True


def contain(logger: logging.Logger, kind: str, key: str, what: str) -> None:
    """Logs (with its traceback the first time per key, at debug level after that) and counts an exception
    that one item of a loop raised.

    Call from an ``except Exception`` block; `what` says which item was skipped, e.g. "job 3f2a".
    """
    count_poison(kind)
    if first_time(kind, key):
        logger.exception("%s: skipped (%s); the loop goes on", what, kind)
    else:
        logger.debug("%s: skipped again (%s)", what, kind)


def is_transient(error: BaseException) -> bool:
    """A database that cannot be reached or written now: not the item's fault, so it is not skipped."""
    return isinstance(error, (OperationalError, InterfaceError, DisconnectionError))


@contextmanager
def isolated(session: Session, logger: logging.Logger, kind: str, key: str, what: str) -> Iterator[None]:
    """Runs the block in a savepoint; an exception rolls back only the block's changes and is contained.

    Database trouble (`is_transient`) is re-raised: the whole pass fails and is retried, as before.
    """
    try:
        with session.begin_nested():
            yield
    except Exception as error:  # noqa: BLE001 - one bad item must not stop the loop for everyone
        if is_transient(error):
            raise
        contain(logger, kind, key, what)
