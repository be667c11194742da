"""SQLite stays single: exactly one coordinator process may run on a SQLite database.

Replicas agree through PostgreSQL's advisory locks (server/db/locks.py); SQLite has nothing of the kind
between processes that could make two coordinators' schedulers and reconcilers run once. So the first
coordinator holds an exclusive `flock` on a file beside the database for as long as it runs (the kernel
frees it when the process dies, however it dies), and a second one exits at once and says what to do.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from sqlalchemy.engine import make_url


class AlreadyRunning(Exception):
    """Another coordinator holds the SQLite database."""


class SingleInstanceLock:
    """Held from `acquire` until `release` (or the process's end)."""

    def __init__(self, database_url: str) -> None:
        self.path = lock_path(database_url)
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Takes the lock, or raises AlreadyRunning naming the holder and what to do; no-op without a file."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = self.path.open("a+")
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "another process"
            file.close()
            raise AlreadyRunning(
                f"another coordinator ({holder}) already runs on the SQLite database {self.path.with_suffix('')}: "
                "with SQLite exactly one coordinator may run. Stop it first, or, for several replicas, put "
                "every coordinator on one PostgreSQL database (--db-url postgresql+psycopg://USER@HOST/DB)"
            ) from None
        file.seek(0)
        file.truncate()
        file.write(f"pid {os.getpid()}")
        file.flush()
        self._file = file

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file frees the flock
            self._file = None


def lock_path(database_url: str) -> Path | None:
    """`<database file>.lock` for a SQLite file URL; None for other databases and in-memory SQLite."""
    if not database_url:
        return None
    url = make_url(database_url)
    if not url.drivername.startswith("sqlite") or url.database in (None, "", ":memory:"):
        return None
    return Path(f"{url.database}.lock")
