"""Engine and session set-up: SQLite tuned as a real default, any SQLAlchemy URL otherwise."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from mwms.server.db import locks
from mwms.server.db.write_turns import WriteTurns


class Database:
    """Owns the engine and hands out sessions; the caller of `write()`/`read()` owns the transaction."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self.is_postgres = url.startswith("postgresql")
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
        self.engine: Engine = create_engine(url, **kwargs)
        if self.is_sqlite:
            _tune_sqlite(self.engine)
        write_engine = self.engine.execution_options(mwms_immediate=True) if self.is_sqlite else self.engine
        self._write = sessionmaker(write_engine, expire_on_commit=False)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._writer_lock = threading.Lock()
        # SQLite's writers in every process take turns (server/db/write_turns.py).
        self._turns = WriteTurns(make_url(url).database if self.is_sqlite else None)
        self._lock_engine: Engine | None = None

    @property
    def lock_engine(self) -> Engine:
        """Connections of their own for the loops' advisory locks (server/live/pass_locks.py): a leader
        holds one per loop for as long as it leads, which must never starve the sessions' pool."""
        if self._lock_engine is None:
            self._lock_engine = create_engine(self.url, pool_size=5, max_overflow=1, pool_pre_ping=True)
        return self._lock_engine

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A read-then-write transaction, committed on success; one at a time, across every replica.

        SQLite takes its write lock up front (BEGIN IMMEDIATE), once the writer's turn came (writers of the
        file take turns: server/db/write_turns.py). PostgreSQL takes the writer advisory lock first
        (server/db/locks.py), so read-then-write passes (a task report on one replica and the reconciler
        on another ending the same attempt) never interleave; this process also lines its own writers up
        before they take a pooled connection to wait on it.
        """
        if self.is_sqlite:
            with self._turns.turn(), self._write() as session, session.begin():
                yield session
            return
        with self._writer_lock, self._write() as session, session.begin():
            if self.is_postgres:
                locks.wait_for(session.connection(), locks.WRITER)
            yield session

    @contextmanager
    def write_unserialised(self) -> Iterator[Session]:
        """A write transaction that does not wait for the writer lock on PostgreSQL (on SQLite, `write`).

        Only for writes that move a time forward and decide nothing (what a replica heard: agent liveness,
        task progress, its beat), each a conditional UPDATE that never goes backwards, so they commute
        with every decision; a decision that reads them locks the rows it judges (newly_lost_agents).
        They must not queue behind decisions and telemetry: a replica's liveness flush that waited seconds
        for the writer lock let its agents read offline while they were heartbeating.
        """
        if not self.is_postgres:
            with self.write() as session:
                yield session
            return
        with self._write() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction."""
        with self._read() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
        if self._lock_engine is not None:
            self._lock_engine.dispose()


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN itself, so writers can take the lock up front.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("mwms_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def is_deadlock(error: BaseException) -> bool:
    """PostgreSQL ended this transaction to break a lock cycle (SQLSTATE 40P01): repeating it is safe
    where the transaction only moves times forward."""
    return getattr(getattr(error, "orig", None), "sqlstate", None) == "40P01"
