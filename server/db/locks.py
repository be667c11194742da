"""PostgreSQL advisory locks: how replicas of the coordinator on one database agree without another service.

Every lock here is transaction-scoped (`pg_advisory_xact_lock`): it is freed when its transaction ends, and
when its holder dies the server ends the transaction, so a killed replica never leaves one held. They work
behind PgBouncer in transaction mode, where session-level locks do not.

- The writer lock: every read-then-write transaction takes it first (server/db/engine.py), so writers of all
  replicas run one at a time, exactly as SQLite's BEGIN IMMEDIATE makes the writers of one process do: a
  decision (a placement, an attempt ended) is always made on the newest committed state.
- Pass locks: a background loop's pass runs on the one replica that wins its lock (server/live/pass_locks.py).
- The migration lock: one replica upgrades the schema while the others wait (server/db/migrate.py).

Keys are 64-bit integers derived from a name, so the set of locks is spelled in one place, by name.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection, text

NAMESPACE = "mwms:"


def lock_key(name: str) -> int:
    """The advisory lock key of `name`: a stable signed 64-bit integer."""
    digest = hashlib.sha256((NAMESPACE + name).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


WRITER = lock_key("writer")
MIGRATIONS = lock_key("migrations")


def wait_for(connection: Connection, key: int) -> None:
    """Waits for the transaction-scoped lock `key` in `connection`'s open transaction."""
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def try_take(connection: Connection, key: int) -> bool:
    """Takes the transaction-scoped lock `key` if nobody holds it; False at once otherwise."""
    return bool(connection.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": key}).scalar())
