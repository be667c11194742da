"""The coordinator's background loops: the scheduler, and the reconciler with the liveness flush before it."""

from __future__ import annotations

import asyncio
import logging
import time

from mwms.loop import run_every_async
from server.db.engine import Database
from server.db.models import utcnow
from server.live.hub import AgentHub
from server.live.liveness import Liveness
from server.services.agents import record_heartbeats
from server.services.command_targets import track_command_targets
from server.services.reconcile import reconcile
from server.services.retention import PurgeCursor, cutoff, purge_batch
from server.services.scheduling import SharingPolicy, schedule_pass
from server.services.waiting_jobs import WaitingJobs
from server.settings import Settings

log = logging.getLogger("mwms.server.loops")
RETENTION_PAUSE_S = 0.05


class BackgroundLoops:
    """Starts and stops the scheduler and reconciler; `poke()` runs the scheduler soon."""

    def __init__(self, db: Database, settings: Settings, hub: AgentHub, liveness: Liveness) -> None:
        self.db = db
        self.settings = settings
        self.hub = hub
        self.liveness = liveness
        self.sharing = SharingPolicy.of(settings)
        self.waiting = WaitingJobs()  # the scheduler's cache of waiting jobs
        self._pokes = self._pokes_seen = 0
        self._idle = False
        self._last_pass = 0.0
        self.scheduler_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()
        self._purge_cursor = PurgeCursor()  # retention goes on where it stopped; a restart walks once more

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(
                run_every_async(
                    self.settings.scheduler_interval_s, self._schedule, wake=self.scheduler_wake, logger=log
                )
            ),
            asyncio.create_task(run_every_async(1.0, self._reconcile, logger=log)),
        ]
        if self.settings.telemetry_retention_days > 0:
            self._tasks.append(
                asyncio.create_task(
                    run_every_async(self.settings.retention_interval_s, self._purge_old_telemetry, logger=log)
                )
            )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.flush_liveness()  # a restart's grace then counts from what was last heard
        except Exception:  # noqa: BLE001 - shutting down either way
            log.exception("writing agent liveness at shutdown failed")

    async def flush_liveness(self) -> None:
        """Writes what the in-memory liveness saw since the last flush, in one transaction."""
        seen = self.liveness.take()
        if not seen:
            return

        def run() -> None:
            with self.db.write() as session:
                record_heartbeats(session, seen, self.settings.agent_timeout_s)

        try:
            await asyncio.to_thread(run)
        except BaseException:
            self.liveness.restore(seen)
            raise

    async def _purge_old_telemetry(self) -> None:
        """Deletes telemetry of jobs past MWMS_TELEMETRY_RETENTION_DAYS, one short transaction a batch."""
        before = cutoff(self.settings.telemetry_retention_days)
        if before is None:
            return
        cursor = self._purge_cursor

        def run() -> bool:
            with self.db.write() as session:
                return purge_batch(session, before, cursor).more

        while await asyncio.to_thread(run):
            await asyncio.sleep(RETENTION_PAUSE_S)  # other writers get the lock between batches

    def poke(self) -> None:
        """Asks for a scheduler pass soon; safe from any thread."""
        self._loop.call_soon_threadsafe(self._poked)

    def _poked(self) -> None:
        self._pokes += 1
        self.scheduler_wake.set()

    async def _schedule(self) -> None:
        # Every change that can let a job in pokes the scheduler (a submit, a task that ended, an agent
        # that joined, a quota raised); what only time changes (a restart's backoff, a hold running out,
        # a job reaching the minimum run time before it may be preempted) is caught by the timed passes,
        # which run less often while passes find nothing to do: a long queue costs less when idle.
        now = time.monotonic()
        poked = self._pokes != self._pokes_seen
        if not poked and self._idle and now - self._last_pass < self.settings.scheduler_idle_interval_s:
            return
        self._pokes_seen, self._last_pass = self._pokes, now
        connected = frozenset(self.hub.connected())

        def run() -> list[str]:
            return schedule_pass(self.db, connected=connected, policy=self.sharing, waiting_jobs=self.waiting)

        touched = await asyncio.to_thread(run)
        self._idle = not touched
        if touched:
            self.hub.wake(touched)

    async def _reconcile(self) -> None:
        # Liveness first, so the lost decision below never runs on heartbeats not written yet. It is
        # made as of the moment they were taken: both writes may wait for the writer (a long telemetry
        # transaction), and that wait must not age every agent into "lost".
        taken_at = utcnow()
        await self.flush_liveness()

        def run() -> set[str]:
            with self.db.write() as session:
                targets = track_command_targets(session)
                reconcile(
                    session,
                    backoff_base_s=self.settings.restart_backoff_s,
                    default_startup_timeout_s=self.settings.startup_timeout_s,
                    now=taken_at,
                )
            return targets

        targets = await asyncio.to_thread(run)
        if targets:
            self.hub.wake(targets)
            self.poke()  # ended attempts may restart
