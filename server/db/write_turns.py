"""SQLite's writers take turns: an flock on a file beside the database, taken before BEGIN IMMEDIATE.

SQLite has a writer that finds the write lock taken wait by polling: its busy handler sleeps 1, 2, 5, ...
up to 100 ms between tries. A writer that holds the lock nearly all the time wins nearly every race:
the ingest process (server/ingest_worker.py) stores 100,000 items a second in transactions of a quarter
second with a few milliseconds between them, and the coordinator's own writes (a task report, the
liveness flush, POST /jobs) and the scheduler process's passes waited up to 1-2 s for a gap that their
next try happened to hit (bench/README.md, ingest: `api_write_p99_ms`).

So every writer of a database file, in any process (the coordinator's threads, its scheduler and ingest
processes), first takes its turn: an exclusive flock on `<database file>-writers`, reached through a
door, an flock on `<database file>-writers.door` held only while waiting for the turn. A writer that
gives its turn back and wants the next one finds the door held by the writer already waiting, so turns
alternate, however short the gap between one writer's transactions: a transaction waits at most about
as long as the one before it held the lock. Locks are tried every millisecond (STEP_S); the kernel frees
them when their holder dies. The turn is advisory: a program that writes without it (the sqlite3 shell)
meets SQLite's own locking, as before.

Rules: a writer already holding its turn in this thread (a write inside a write) takes none, so it
cannot wait on itself (SQLite's busy timeout then decides, as before); one that has waited MAX_WAIT_S
goes on to SQLite's own locking (logged), rather than waiting forever on a holder that hangs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("mwms.server.db")
STEP_S = 0.001
# As long as SQLite's own busy timeout (server/db/engine.py), after which a writer meets its locking.
MAX_WAIT_S = 30.0
SUFFIX = "-writers"
DOOR_SUFFIX = "-writers.door"


class WriteTurns:
    """The turns of the writers of one SQLite database file; none for an in-memory database."""

    def __init__(self, database_file: str | None) -> None:
        on_disk = bool(database_file) and database_file != ":memory:"
        self.path = Path(f"{database_file}{SUFFIX}") if on_disk else None
        self.door = Path(f"{database_file}{DOOR_SUFFIX}") if on_disk else None
        self._held = threading.local()

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Holds this process's and thread's turn to write for the block (see the module's rules)."""
        if self.path is None or self.door is None or getattr(self._held, "turn", False):
            yield
            return
        deadline = time.monotonic() + MAX_WAIT_S
        fd = _open(self.path)
        try:
            door = _open(self.door)
            try:
                if _take(door, deadline):
                    _take(fd, deadline)
            finally:
                os.close(door)  # the next writer may wait at the turn now
            self._held.turn = True
            yield
        finally:
            self._held.turn = False
            os.close(fd)  # gives the turn back


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _take(fd: int, deadline: float) -> bool:
    """Locks `fd` (an flock), trying every STEP_S; False when `deadline` passed first (logged)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                log.warning("no turn to write after %.0f s; going on to SQLite's own locking", MAX_WAIT_S)
                return False
            time.sleep(STEP_S)
