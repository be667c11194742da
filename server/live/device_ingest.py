"""One writer for the device samples of every agent's stream: checked on arrival, written once a second.

At 1,000 agents with 8 GPUs each sampling every 5 s, 1,600 rows arrive a second: streams hand their
samples to `accept`, which checks them (services.observing.device_telemetry), keeps the newest per device in memory
and queues the rows; a loop writes everything queued in one transaction a second, and another deletes
samples past their retention. Device telemetry is best effort: nothing is acknowledged or resent, and
when the database is in trouble, or the queue is full (MAX_QUEUED_ROWS), samples are dropped and said so.
"""

from __future__ import annotations

import asyncio
import logging

from mwms.loop import run_every_async
from mwms.server.db.engine import Database
from mwms.server.db.models import utcnow
from mwms.server.live.pass_locks import PassLocks
from mwms.server.poison import count_poison, first_time, is_transient
from mwms.server.services.observing import device_telemetry
from mwms.server.services.observing.device_telemetry import IncomingSample, LatestSamples
from mwms.server.settings import Settings

log = logging.getLogger("mwms.server.devices")
FLUSH_INTERVAL_S = 1.0
MAX_QUEUED_ROWS = 100_000
RETENTION_PAUSE_S = 0.05


class DeviceTelemetryWriter:
    """Checks and queues the device samples of every stream; `start()` runs the writing and purging loops."""

    def __init__(self, db: Database, settings: Settings, passes: PassLocks | None = None) -> None:
        self._db = db
        self._settings = settings
        self._passes = passes or PassLocks(db)  # the purge runs on the replica leading "device-retention"
        self.latest = LatestSamples()
        self._rows: list[dict[str, object]] = []
        # The registered GPU indices of each agent, read once per stream (a new registration opens a new one).
        self._gpus: dict[str, tuple[object, frozenset[int]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.stored = 0  # rows committed (tests, benchmarks)
        self.dropped = 0  # rows dropped: queue full or database in trouble

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(run_every_async(FLUSH_INTERVAL_S, self.flush, logger=log)),
            asyncio.create_task(
                run_every_async(self._settings.retention_interval_s, self._purge_once, logger=log)
            ),
        ]

    async def _purge_once(self) -> None:
        await self._passes.run("device-retention", self.purge)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.flush()
        except Exception:  # noqa: BLE001 - shutting down either way; telemetry is best effort
            log.warning("the last device samples could not be written at shutdown")

    async def accept(self, stream: object, agent_id: str, samples: list[IncomingSample]) -> None:
        """Checks one message's samples from `stream` of `agent_id`; keeps and queues the good ones."""
        gpus = await self._gpu_indices(stream, agent_id)
        checked = device_telemetry.check_samples(samples, gpus)
        if checked.refused:
            for _ in range(checked.refused):
                count_poison("device_sample")
            self.latest.count_refused(agent_id, checked.refused)
            if first_time("device_sample", agent_id):
                log.warning(
                    "agent %s: refused %d device sample(s): %s", agent_id, checked.refused, checked.reason
                )
        if not checked.accepted:
            return
        at = utcnow()
        self.latest.put(agent_id, checked.accepted, at)
        if len(self._rows) + len(checked.accepted) > MAX_QUEUED_ROWS:
            self.dropped += len(checked.accepted)
            return
        self._rows.extend(device_telemetry.sample_row(agent_id, s, at) for s in checked.accepted)

    async def _gpu_indices(self, stream: object, agent_id: str) -> frozenset[int]:
        cached = self._gpus.get(agent_id)
        if cached is not None and cached[0] is stream:
            return cached[1]

        def read() -> frozenset[int]:
            with self._db.read() as session:
                return device_telemetry.registered_gpu_indices(session, agent_id)

        gpus = await asyncio.to_thread(read)
        if cached is not None and cached[1] != gpus:
            self.latest.forget(agent_id)  # the agent registered other devices
        self._gpus[agent_id] = (stream, gpus)
        return gpus

    async def flush(self) -> None:
        """Writes every queued row in one transaction; on failure they are dropped (best effort)."""
        rows, self._rows = self._rows, []
        if not rows:
            return

        def write() -> None:
            with self._db.write() as session:
                device_telemetry.store_rows(session, rows)

        try:
            await asyncio.to_thread(write)
        except Exception as error:  # noqa: BLE001 - telemetry is best effort: drop, say so, go on
            self.dropped += len(rows)
            transient = "the database is busy or unreachable" if is_transient(error) else type(error).__name__
            log.warning("dropped %d device sample(s): %s", len(rows), transient)
            return
        self.stored += len(rows)

    async def purge(self) -> None:
        """Deletes samples past their retention, agent by agent, one short transaction per batch of agents."""
        settings = self._settings
        before = device_telemetry.retention_cutoff(
            settings.device_sample_retention_hours, settings.telemetry_retention_days, utcnow()
        )
        if before is None:
            return
        after = ""
        while True:

            def run(after: str = after) -> tuple[list[str], bool]:
                with self._db.write() as session:
                    agent_ids = device_telemetry.agents_after(session, after)
                    _, more = device_telemetry.purge_before(session, agent_ids, before)
                return agent_ids, more

            agent_ids, more = await asyncio.to_thread(run)
            if not agent_ids:
                return
            if not more:
                after = agent_ids[-1]
            await asyncio.sleep(RETENTION_PAUSE_S)  # other writers get the lock between batches
