"""Actions that run only once a session's transaction commits: metrics count what is durable.

A state change is observed where it is made (in the transaction), but a transaction can still roll back,
whole or in part (a savepoint of mwms.server.poison.isolated). `on_commit` keeps the action with the session and
runs it after the outermost commit; a rollback of the transaction or savepoint it was recorded in (or of
one around it) drops it, so a metric never counts a change that did not happen. An action that raises is
logged and counted in mwms_metric_update_failures_total (the exporter's own errors, which an alert watches).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

log = logging.getLogger("mwms.server.metrics")
_PENDING = "mwms_on_commit"
METRIC_UPDATE_FAILURES = Counter(
    "mwms_metric_update_failures",
    "Metric updates after a commit that raised (a bug in the coordinator's metrics; its log has the traceback)",
)


def on_commit(session: Session, action: Callable[[], None]) -> None:
    """Runs `action` after the session's outermost transaction commits; dropped when it rolls back."""
    current = session.get_nested_transaction() or session.get_transaction()
    if current is None:  # not in a transaction: nothing can roll it back
        _run(action)
        return
    session.info.setdefault(_PENDING, []).append((current, action))


def _run(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - a metric must never fail what was committed
        METRIC_UPDATE_FAILURES.inc()
        log.exception("a metric update after commit failed")


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    if session.in_nested_transaction():
        return  # a savepoint was released: its actions wait for the outermost commit
    for _, action in session.info.pop(_PENDING, []):
        _run(action)


def _within(transaction: SessionTransaction | None, ended: SessionTransaction) -> bool:
    while transaction is not None:
        if transaction is ended:
            return True
        transaction = transaction.parent
    return False


@event.listens_for(Session, "after_soft_rollback")
def _after_rollback(session: Session, previous_transaction: SessionTransaction) -> None:
    pending = session.info.get(_PENDING)
    if pending:
        session.info[_PENDING] = [p for p in pending if not _within(p[0], previous_transaction)]
