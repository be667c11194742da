"""The coordinator's background loops: the scheduler, and the reconciler with the flush before it.

The flush runs on every replica every second: what this replica heard (agent liveness, task progress)
and its own beat (server/services/fleet/replicas.py). The passes that decide (scheduling, reconciling,
retention) run on one replica at a time: the one that wins the loop's lock (server/live/pass_locks.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from sqlalchemy.exc import OperationalError

from mwms.loop import run_every_async
from mwms.server.db.engine import Database, is_deadlock
from mwms.server.db.models import utcnow
from mwms.server.live.agent_notify import Doorbell
from mwms.server.live.hub import AgentHub
from mwms.server.live.liveness import Liveness
from mwms.server.live.pass_locks import PassLocks
from mwms.server.live.scheduler_process import SchedulerProcess, runs_apart, worker_config
from mwms.server.live.task_progress import TaskProgress
from mwms.server.observability.instruments import observe_scheduler_pass
from mwms.server.services.fleet import replicas
from mwms.server.services.fleet.command_targets import track_command_targets
from mwms.server.services.fleet.heard import write_heard
from mwms.server.services.job_life.hangs import record_progress
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.observing.retention import PurgeCursor, cutoff, purge_batch
from mwms.server.services.scheduler import fair_share
from mwms.server.services.scheduler.scheduling import SharingPolicy, schedule_pass
from mwms.server.services.scheduler.waiting_jobs import WaitingJobs
from mwms.server.settings import Settings

log = logging.getLogger("mwms.server.loops")
RETENTION_PAUSE_S = 0.05
# Progress flushed to the database is forgotten in memory after this long.
PROGRESS_MEMORY = timedelta(minutes=10)
# A flush slower than this is logged with where its time went.
SLOW_FLUSH_S = 2.0
FLUSH_ATTEMPTS = 3
# A pass starts at least this long after the last one ended: the pokes of a burst (a 64-worker gang
# reporting its tasks starting pokes over a hundred times) fold into a few passes instead of running
# one after another, each reading the whole cluster, beside the heartbeats this coordinator answers.
MIN_PASS_GAP_S = 0.2


class BackgroundLoops:
    """Starts and stops the scheduler and reconciler; `poke()` runs the scheduler soon."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        hub: AgentHub,
        liveness: Liveness,
        *,
        replica: replicas.ReplicaIdentity,
        passes: PassLocks,
        progress: TaskProgress,
        doorbell: Doorbell | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.hub = hub
        self.liveness = liveness
        self.replica = replica
        self.passes = passes
        self.progress = progress
        # A poke on a replica that does not lead the scheduler rings the one that does (agent_notify.py).
        self._doorbell = doorbell if doorbell is not None and doorbell.enabled else None
        self._ringing = self._ring_again = False
        self._rings: set[asyncio.Task[None]] = set()
        self.sharing = SharingPolicy.of(settings)
        self.waiting = WaitingJobs()  # the scheduler's cache of waiting jobs (passes run here)
        # Passes run in a process of their own (server/live/scheduler_worker.py), unless told otherwise.
        self.scheduler: SchedulerProcess | None = (
            SchedulerProcess(worker_config(settings, db.url, self.sharing, replica.id))
            if runs_apart(settings, db.url)
            else None
        )
        self.last_pass_s: float | None = None  # the last pass's own time (benchmarks)
        self.last_pass_phases: dict[str, float] = {}  # and its parts (scheduling.schedule_pass)
        self.passes_run = 0
        self._pokes = self._pokes_seen = 0
        self._idle = False
        self._last_pass = 0.0
        self._last_pass_end = 0.0  # when the last pass ended (monotonic): MIN_PASS_GAP_S counts from it
        self.scheduler_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()
        self._purge_cursor = PurgeCursor()  # retention goes on where it stopped; a restart walks once more
        # The flush's own thread: in the shared pool it queued for seconds behind writers waiting for the
        # writer lock, and this replica's agents aged towards offline meanwhile.
        self._flush_thread = ThreadPoolExecutor(1, thread_name_prefix="mwms-flush")
        self._progress_write: asyncio.Task[None] | None = None
        self._reconciling: asyncio.Task[None] | None = None  # the reconcile pass under way, if any

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(
                run_every_async(
                    self.settings.scheduler_interval_s, self._schedule, wake=self.scheduler_wake, logger=log
                )
            ),
            asyncio.create_task(run_every_async(1.0, self._flush_and_reconcile, logger=log)),
        ]
        if self.scheduler is not None:
            self._tasks.append(asyncio.create_task(self.scheduler.prepare()))
        if self.settings.telemetry_retention_days > 0:

            async def purge() -> None:
                await self.passes.run("retention", self._purge_old_telemetry)

            self._tasks.append(
                asyncio.create_task(run_every_async(self.settings.retention_interval_s, purge, logger=log))
            )

    async def stop(self) -> None:
        reconciling = [self._reconciling] if self._reconciling is not None else []
        for task in [*self._tasks, *self._rings, *reconciling]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._rings, *reconciling, return_exceptions=True)
        if self.scheduler is not None:
            await self.scheduler.stop()
        try:
            await self.flush_liveness(stopping=True)  # a restart's grace then counts from what was last heard
        except Exception:  # noqa: BLE001 - shutting down either way
            log.exception("writing agent liveness at shutdown failed")
        self._flush_thread.shutdown(wait=False)

    async def flush_liveness(self, stopping: bool = False) -> None:
        """Writes, in one transaction, what this replica heard since the last flush (agent liveness) and its
        beat (or, `stopping`, that it stopped); then, on its own, the progress its tasks reported.

        The liveness transaction does not wait for the writer lock (Database.write_unserialised) and
        locks the agent rows it writes first, in id order, as every other writer that locks several agents
        does (the hello writer, the reconciler), so it never closes a cycle with them
        (server/services/fleet/heard.py). Progress is written under the writer lock: decisions lock task
        rows in no set order. One progress write at a time; what comes meanwhile waits for the next flush."""
        seen = self.liveness.take()
        pools = self.liveness.take_pools()
        held = self.hub.connected()
        ran = self.passes.leads()

        def run() -> tuple[float, float]:
            began = time.monotonic()
            for attempt in range(FLUSH_ATTEMPTS):
                try:
                    with self.db.write_unserialised() as session:
                        locked = time.monotonic()
                        write_heard(
                            session,
                            self.replica,
                            seen,
                            pools,
                            held,
                            ran,
                            self.settings.agent_timeout_s,
                            stopping,
                        )
                    return began, locked
                except OperationalError as error:
                    # A reconciler pass locking lost and moving agents in two batches can still meet
                    # this flush in a cycle; PostgreSQL ends one, and this write is safe to repeat.
                    if not is_deadlock(error) or attempt == FLUSH_ATTEMPTS - 1:
                        raise
            raise AssertionError("unreachable")

        called = time.monotonic()
        try:
            began, locked = await self._loop.run_in_executor(self._flush_thread, run)
        except BaseException:
            self.liveness.restore(seen)
            self.liveness.restore_pools(pools)
            raise
        done = time.monotonic()
        if done - called > SLOW_FLUSH_S:
            # Agents read offline once their liveness is older than the agent timeout: say why it aged.
            log.warning(
                "writing what this replica heard took %.1f s (%.1f s waiting for a thread, %.1f s for a "
                "connection, %.1f s writing %d agents' liveness)",
                done - called,
                began - called,
                locked - began,
                done - locked,
                len(seen),
            )
        if stopping:
            if self._progress_write is not None:
                await asyncio.gather(self._progress_write, return_exceptions=True)
            await self._write_progress()
        elif self._progress_write is None or self._progress_write.done():
            self._progress_write = asyncio.create_task(self._write_progress())

    async def _write_progress(self) -> None:
        progressed = self.progress.take_changed()
        if not progressed:
            return

        def run() -> None:
            with self.db.write() as session:
                record_progress(session, progressed)

        try:
            await asyncio.to_thread(run)
        except Exception:  # noqa: BLE001 - written with the next flush's
            self.progress.restore(progressed)
            log.exception("writing task progress failed; it goes with the next flush")
            return
        self.progress.forget_before(utcnow() - PROGRESS_MEMORY)

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
        if self._doorbell is not None and "scheduler" not in self.passes.leads():
            self._ring_leader()

    def poked_by_ring(self, _items: list[str]) -> None:
        """Another replica's poke (event loop only): a pass soon, if this replica leads the scheduler."""
        self._pokes += 1
        self.scheduler_wake.set()

    def _ring_leader(self) -> None:
        # One ring at a time; a poke while one is on its way rings once more after it, so a change
        # committed meanwhile is never left for the leader's idle pass.
        if self._ringing:
            self._ring_again = True
            return
        self._ringing = True
        task = asyncio.create_task(self._send_rings())
        self._rings.add(task)
        task.add_done_callback(self._rings.discard)

    async def _send_rings(self) -> None:
        assert self._doorbell is not None
        try:
            while True:
                self._ring_again = False
                await self._doorbell.ring("scheduler", [self.replica.id])
                if not self._ring_again:
                    return
        finally:
            self._ringing = False

    async def _schedule(self) -> None:
        # Every change that can let a job in pokes the scheduler (a submit, a task that ended, an agent
        # that joined, a quota raised); what only time changes (a restart's backoff, a hold running out,
        # a job reaching the minimum run time before it may be preempted) is caught by the timed passes,
        # which run less often while passes find nothing to do: a long queue costs less when idle.
        now = time.monotonic()
        poked = self._pokes != self._pokes_seen
        if not poked and self._idle and now - self._last_pass < self.settings.scheduler_idle_interval_s:
            return
        pause = pause_before_pass(self._last_pass_end, now)
        if pause > 0:
            await asyncio.sleep(pause)  # pokes meanwhile are taken by this pass
        pokes = self._pokes
        held = frozenset(self.hub.connected())

        def run() -> list[str]:
            connected = held
            if self.db.is_postgres:
                with self.db.read() as session:
                    connected = held | replicas.streams_elsewhere(session, self.replica.id)
            began = time.perf_counter()
            try:
                return schedule_pass(
                    self.db, connected=connected, policy=self.sharing, waiting_jobs=self.waiting
                )
            finally:
                self.last_pass_s = time.perf_counter() - began

        async def one_pass() -> None:
            if self.scheduler is not None:
                result = await self.scheduler.run_pass(held)
                self.last_pass_s, self.last_pass_phases = result.seconds, result.phases
                touched = result.touched
            else:
                touched = await asyncio.to_thread(run)
            self.passes_run += 1
            if self.last_pass_s is not None:
                observe_scheduler_pass(self.last_pass_s)
            self._idle = not touched
            if touched:
                self.hub.wake(touched)

        # A poke seen while another replica holds the pass stays pending: this replica tries again at its
        # next tick, in case that pass read before the change that poked.
        try:
            if await self.passes.run("scheduler", one_pass):
                self._pokes_seen, self._last_pass = pokes, now
        finally:
            self._last_pass_end = time.monotonic()

    async def _flush_and_reconcile(self) -> None:
        # Liveness first, so the lost decision below never runs on heartbeats not written yet. It is
        # made as of the moment they were taken: both writes may wait for the writer (a long telemetry
        # transaction), and that wait must not age every agent into "lost". With replicas, every replica
        # flushes what it heard every second, so the reconciler's replica judges from all of them.
        # The reconcile runs apart from this loop: while it waits for the writer lock (behind a long write,
        # another process's included) the flush goes on every second. When it waited inside this loop, no
        # liveness was written meanwhile, and every agent read offline in the API after the agent timeout.
        taken_at = utcnow()
        await self.flush_liveness()
        if self._reconciling is not None and not self._reconciling.done():
            return  # the last reconcile still waits; the next tick after it ends starts one

        started = time.monotonic()
        led: list[float] = []

        async def one_pass() -> None:
            led.append(time.monotonic())
            await self._reconcile(taken_at)

        async def reconcile_pass() -> None:
            try:
                await self.passes.run("reconciler", one_pass)
                if led and time.monotonic() - started > SLOW_FLUSH_S:
                    log.warning(
                        "a reconcile pass took %.1f s (%.1f s waiting for the reconciler's lead, %.1f s "
                        "reconciling)",
                        time.monotonic() - started,
                        led[0] - started,
                        time.monotonic() - led[0],
                    )
            except Exception:  # noqa: BLE001 - logged; the next tick reconciles again
                log.exception("reconciling failed")

        self._reconciling = asyncio.create_task(reconcile_pass())

    async def _reconcile(self, taken_at: datetime) -> None:

        def run() -> set[str]:
            with self.db.write() as session:
                targets = track_command_targets(session)
                reconcile(
                    session,
                    moving_grace_s=self.settings.reconnect_window_s if self.db.is_postgres else 0.0,
                    backoff_base_s=self.settings.restart_backoff_s,
                    default_startup_timeout_s=self.settings.startup_timeout_s,
                    now=taken_at,
                )
                fair_share.accrue(session, taken_at, self.settings.fair_share_half_life_hours * 3600)
            return targets

        targets = await asyncio.to_thread(run)
        if targets:
            self.hub.wake(targets)
            self.poke()  # ended attempts may restart


def pause_before_pass(last_end: float, now: float) -> float:
    """Seconds to wait before a pass so that it starts MIN_PASS_GAP_S after the last one ended."""
    return min(MIN_PASS_GAP_S, max(0.0, MIN_PASS_GAP_S - (now - last_end)))
