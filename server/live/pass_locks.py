"""Background work exactly once across replicas: each loop runs on the replica that holds its lock.

Every replica runs every loop (the scheduler, the reconciler, hang detection, retention); before a pass it
makes sure it holds the loop's transaction-scoped advisory lock (server/db/locks.py). The first replica to
take a lock keeps it, in a transaction of its own held open on a connection of its own, and runs every
pass of that loop until it dies or stops; the others find it taken and skip their passes. So one replica
leads each loop, which the replicas list shows (`leads`, server/services/fleet/replicas.py). When the leader dies,
PostgreSQL ends its transaction with its connection and a survivor takes the lock at its next tick: the
loop moves within one interval. The leader checks its lock's connection before each pass, so one that
lost its connection stops at once.

The lock transaction writes nothing and holds no snapshot between statements (READ COMMITTED), so holding
it open costs one connection and keeps no row versions alive; it works behind PgBouncer in transaction
mode, which keeps a transaction on one server connection.

A replica that serves the agents only (`--serve agents`) is patient: it tries a lock it does not hold at
most every PATIENT_TRY_S, and not in its first PATIENT_TRY_S, so the loops go to replicas that serve the API
when there are any and its event loop stays free for heartbeats. On SQLite there is one coordinator
(server/db/single_instance.py) and every pass runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import Connection, text

from mwms.server.db import locks
from mwms.server.db.engine import Database

log = logging.getLogger("mwms.server.loops")
PATIENT_TRY_S = 2.0
LOOPS = ("scheduler", "reconciler", "hang-detection", "retention", "device-retention")


class PassLocks:
    """Runs a loop's pass only while this replica holds the loop's lock."""

    def __init__(self, db: Database, patient: bool = False) -> None:
        self._db = db
        self._patient = patient
        self._started = time.monotonic()
        self._keys = {name: locks.lock_key(f"loop:{name}") for name in LOOPS}
        self._held: dict[str, Connection] = {}
        self._tried: dict[str, float] = {}
        self.skipped: dict[str, int] = dict.fromkeys(LOOPS, 0)  # passes another replica had (tests, bench)

    async def run(self, name: str, one_pass: Callable[[], Awaitable[object]]) -> bool:
        """Runs `one_pass` if this replica holds (or now takes) `name`'s lock; False when another does."""
        if self._db.is_postgres and not await self._hold(name):
            self.skipped[name] += 1
            return False
        await one_pass()
        return True

    async def _hold(self, name: str) -> bool:
        held = self._held.get(name)
        if held is not None:
            if await asyncio.to_thread(_alive, held):
                return True
            del self._held[name]
            log.warning("lost the %s lock's database connection; another replica may lead it now", name)
            await asyncio.to_thread(_close, held)
        now = time.monotonic()
        if self._patient and (
            now - self._started < PATIENT_TRY_S or now - self._tried.get(name, 0.0) < PATIENT_TRY_S
        ):
            return False
        self._tried[name] = now
        taken = await asyncio.to_thread(self._take, self._keys[name])
        if taken is None:
            return False
        self._held[name] = taken
        log.info("this replica now leads the %s loop", name)
        return True

    def _take(self, key: int) -> Connection | None:
        connection = self._db.lock_engine.connect()
        try:
            connection.begin()
            if locks.try_take(connection, key):
                return connection
        except BaseException:
            _close(connection)
            raise
        _close(connection)
        return None

    async def release_all(self) -> None:
        """A clean stop: every lock this replica holds is freed now, for the others' next tick."""
        held, self._held = list(self._held.values()), {}
        for connection in held:
            await asyncio.to_thread(_close, connection)

    def leads(self) -> list[str]:
        """The loops whose locks this replica holds (all of them on SQLite)."""
        return sorted(self._held) if self._db.is_postgres else list(LOOPS)


def _alive(connection: Connection) -> bool:
    try:
        connection.execute(text("SELECT 1"))
    except Exception:  # noqa: BLE001 - a dead connection: its lock is gone with it
        return False
    return True


def _close(connection: Connection) -> None:
    try:
        connection.rollback()  # ends the transaction, and the lock with it
    except Exception:  # noqa: BLE001 - a dead connection has nothing to roll back
        pass
    finally:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - nor anything to close
            pass
