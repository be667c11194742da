"""SQLite's writers take turns, first come first served, across every process that writes the database file.

SQLite has a writer that finds the write lock taken wait by polling: its busy handler sleeps 1, 2, 5, ...
up to 100 ms between tries. A writer that holds the lock nearly all the time wins nearly every race:
the ingest process (server/ingest_worker.py) stores 100,000 items a second in transactions of a quarter
second with a few milliseconds between them, and the coordinator's own writes (a task report, the
liveness flush, POST /jobs) and the scheduler process's passes waited up to 1-2 s for a gap that their
next try happened to hit (bench/README.md, ingest: `api_write_p99_ms`).

So every writer of a database file, in any process (the coordinator's threads, its scheduler and ingest
processes), first takes a ticket and waits for the writer with the ticket before it to finish, a queue
kept by the kernel's locks on `<database file>-writers`:

- tickets are numbered by a counter stored in the file's first 8 bytes, read and advanced under an flock
  of the file (held for a few system calls);
- a writer holds a lock on its ticket's byte (byte 8 + ticket, an open-file-description record lock,
  which threads of one process hold apart) from taking the ticket to giving the turn back, and waits,
  blocked in the kernel, until it can lock the byte of the ticket before its own: that writer has
  finished, or died (the kernel frees its locks).

Only the next writer watches a finishing writer's byte, so no writer can win a race against others waiting
longer. (The queue before this one let the waiting writers race for a lock tried every millisecond: the
coordinator's threads, which need the interpreter's lock to try, lost it to single-threaded processes for
up to 13 s in bench/sharing.py's scale scenario, and the trying took the interpreter's lock from its event
loop.) The turn is advisory: a program that writes without it (the sqlite3 shell) meets SQLite's own
locking, as before.

Rules: a writer already holding its turn in this thread (a write inside a write) takes none, so it cannot
wait on itself (SQLite's busy timeout then decides, as before); one that has waited MAX_WAIT_S for the
writer before it goes on to SQLite's own locking (logged), rather than waiting forever on a holder that
hangs. Where the system has no open-file-description locks (not Linux), writers take no turns.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("mwms.server.db")
# As long as SQLite's own busy timeout (server/db/engine.py), after which a writer meets its locking.
MAX_WAIT_S = 30.0
SUFFIX = "-writers"
COUNTER = struct.Struct("<Q")
FIRST_BYTE = COUNTER.size  # ticket t's byte is FIRST_BYTE + t
_SET_LOCK = getattr(fcntl, "F_OFD_SETLK", None)  # Linux >= 3.15
_SET_LOCK_WAIT = getattr(fcntl, "F_OFD_SETLKW", None)


class WriteTurns:
    """The turns of the writers of one SQLite database file; none for an in-memory database."""

    def __init__(self, database_file: str | None) -> None:
        on_disk = bool(database_file) and database_file != ":memory:" and _SET_LOCK_WAIT is not None
        self.path = Path(f"{database_file}{SUFFIX}") if on_disk else None
        self._held = threading.local()

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Holds this process's and thread's turn to write for the block (see the module's rules)."""
        if self.path is None or getattr(self._held, "turn", False):
            yield
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            ticket = take_ticket(fd)
            if ticket > 0:
                wait_for(self.path, fd, ticket - 1, MAX_WAIT_S)
            self._held.turn = True
            yield
        finally:
            self._held.turn = False
            os.close(fd)  # frees this ticket's byte: the next writer's turn


def take_ticket(fd: int) -> int:
    """The next ticket, its byte locked by `fd` before any later ticket is handed out."""
    fcntl.flock(fd, fcntl.LOCK_EX)  # held for the few calls below; the kernel queues the takers
    try:
        stored = os.pread(fd, COUNTER.size, 0)
        ticket = COUNTER.unpack(stored)[0] if len(stored) == COUNTER.size else 0
        os.pwrite(fd, COUNTER.pack(ticket + 1), 0)
        if not _lock_byte(fd, ticket):
            raise RuntimeError(f"ticket {ticket}'s byte is locked: another writer was handed the same ticket")
        return ticket
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def wait_for(path: Path, fd: int, ticket: int, timeout_s: float) -> bool:
    """Waits until the writer holding `ticket` has finished; False when `timeout_s` passed first (logged).

    The wait is the kernel's: a thread of its own blocks on the ticket's byte (through its own open file
    description) while this one blocks on an event, so a queue of waiting threads costs no CPU and does not
    take the interpreter's lock from the coordinator's event loop (trying every millisecond did: 32 waiting
    threads woke 32,000 times a second in the scale bench)."""
    if _lock_byte(fd, ticket):
        return True
    ended = threading.Event()

    def watch() -> None:
        try:
            watcher = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                _lock_byte(watcher, ticket, wait=True)
            finally:
                os.close(watcher)  # nobody else waits for this byte: the lock is let go at once
        except OSError as error:  # the file went away (its database with it): wait no longer
            log.warning("could not wait for the writer before this one: %s", error)
        finally:
            ended.set()

    threading.Thread(target=watch, name="mwms-write-turn", daemon=True).start()
    if ended.wait(timeout_s):
        return True
    log.warning("no turn to write after %.0f s; going on to SQLite's own locking", timeout_s)
    return False


def _lock_byte(fd: int, ticket: int, wait: bool = False) -> bool:
    """Write-locks ticket's byte through `fd`'s open file description; False when another one holds it
    (with `wait`, blocks until none does)."""
    assert _SET_LOCK is not None and _SET_LOCK_WAIT is not None
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for open-file-description locks), padding
    request = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, FIRST_BYTE + ticket, 1, 0)
    try:
        fcntl.fcntl(fd, _SET_LOCK_WAIT if wait else _SET_LOCK, request)
    except BlockingIOError:
        return False
    except PermissionError:  # EACCES: some systems' word for the same conflict
        return False
    return True
