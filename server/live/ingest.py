"""One writer for the log and metric batches of every agent's stream: few transactions, acks after commit.

Streams queue their batches (`submit`) and acknowledge each once its future resolves; the writer takes whatever has queued (up to
what the last transaction's pace says fits in TARGET_TRANSACTION_S, within MIN_/MAX_ITEMS_PER_TRANSACTION lines and points) and
stores it in one transaction
(services.agent_messages.accept_telemetry), then resolves each batch's future, so the stream
acknowledges only what is committed. Exactly-once holds through the unique (task_id, seq) constraints:
a resend after a lost ack inserts nothing. Heartbeats never queue here (server/live/liveness.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mwms.server.db.engine import Database
from mwms.server.live import outcomes as outcomes_of
from mwms.server.live.task_progress import TaskProgress
from mwms.server.observability.instruments import count_ingested
from mwms.server.services.agent_messages import TelemetryBatch, accept_telemetry
from mwms.server.services.command_targets import track_command_targets
from mwms.server.services.telemetry import StoreOutcome

log = logging.getLogger("mwms.server.rpc")
# Bounds one transaction, so a burst is committed (and acknowledged) in steps the agents can see.
MAX_ITEMS_PER_TRANSACTION = 50_000
MIN_ITEMS_PER_TRANSACTION = 1_000
# Every other writer (task reports, the liveness flush, the scheduler, POST /jobs) waits for the database's write
# lock while a telemetry transaction holds it: sized by the pace measured, one holds it about this long, so a
# slow database (PostgreSQL's per-row inserts, a loaded machine) never makes liveness wait for seconds.
TARGET_TRANSACTION_S = 1.0


def items_per_transaction(items: int, seconds: float) -> int:
    """How many items the next transaction takes, after the last stored `items` in `seconds`."""
    if items <= 0 or seconds <= 0:
        return MAX_ITEMS_PER_TRANSACTION
    fitting = int(items / seconds * TARGET_TRANSACTION_S)
    return max(MIN_ITEMS_PER_TRANSACTION, min(MAX_ITEMS_PER_TRANSACTION, fitting))


@dataclass
class _Queued:
    batch: TelemetryBatch
    size: int
    done: asyncio.Future[StoreOutcome]


class TelemetryWriter:
    """Groups queued batches into transactions; `store()` returns a batch's outcome once committed."""

    def __init__(
        self,
        db: Database,
        wake_agents: Callable[[Iterable[str]], None],
        on_change: Callable[[], None],
        progress: TaskProgress | None = None,
    ) -> None:
        self._db = db
        self._wake_agents = wake_agents
        self._on_change = on_change
        self._progress = progress  # hang detection's clock: tasks whose lines or points were stored
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self._runner: asyncio.Task[None] | None = None
        self.transactions = 0  # committed transactions (tests, benchmarks)
        self._items_cap = MAX_ITEMS_PER_TRANSACTION

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().done.cancel()

    def submit(self, batch: TelemetryBatch) -> asyncio.Future[StoreOutcome]:
        """Queues `batch`; the future holds its outcome once committed, or what storing it raised."""
        size = len(batch.lines) if batch.lines is not None else len(batch.points or [])
        done: asyncio.Future[StoreOutcome] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Queued(batch, size, done))
        return done

    async def _run(self) -> None:
        while True:
            group = [await self._queue.get()]
            items = group[0].size
            while items < self._items_cap and not self._queue.empty():
                queued = self._queue.get_nowait()
                group.append(queued)
                items += queued.size
            group = [q for q in group if not q.done.cancelled()]  # streams that ended meanwhile
            if not group:
                continue
            try:
                outcomes, targets, held_s = await asyncio.to_thread(self._write, [q.batch for q in group])
            except asyncio.CancelledError:
                outcomes_of.cancel(q.done for q in group)
                raise
            except Exception as error:  # noqa: BLE001 - each stream decides (a transient error ends it)
                outcomes_of.fail((q.done for q in group), error)
                continue
            self.transactions += 1
            self._items_cap = items_per_transaction(items, held_s)
            if self._progress is not None:
                self._progress.seen(
                    q.batch.task_id
                    for q, o in zip(group, outcomes, strict=True)
                    if isinstance(o, StoreOutcome) and q.size
                )
            _count_ingested(group, outcomes)
            outcomes_of.settle([q.done for q in group], outcomes)
            if any(isinstance(o, StoreOutcome) and o.changed for o in outcomes):
                self._on_change()
            if targets:
                self._wake_agents(targets)

    def _write(self, batches: list[TelemetryBatch]) -> tuple[list[StoreOutcome | Exception], set[str], float]:
        """Stores `batches` in one transaction; also says how long it held the write lock (not waited for it)."""
        with self._db.write() as session:
            session.connection()  # BEGIN (IMMEDIATE on SQLite): the write lock is ours from here
            locked_at = time.monotonic()
            targets = track_command_targets(session)
            outcomes = accept_telemetry(session, batches)
        return outcomes, targets, time.monotonic() - locked_at


def _count_ingested(group: list[_Queued], outcomes: list[StoreOutcome | Exception]) -> None:
    """One increment per kind for the whole transaction: what was stored and acknowledged, not refused."""
    lines = points = 0
    for queued, outcome in zip(group, outcomes, strict=True):
        if isinstance(outcome, StoreOutcome):
            accepted = max(0, queued.size - outcome.rejected)
            if queued.batch.lines is not None:
                lines += accepted
            else:
                points += accepted
    count_ingested(lines, points)
