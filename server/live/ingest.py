"""One writer for the log and metric batches of every agent's stream: few transactions, acks after commit.

Streams queue their batches (`submit`) as the protobuf bytes they came in (server/live/ingest_store.py's
RawBatch: nothing is converted per line or point in the event loop that answers agents) and acknowledge
each once its future resolves. The writer takes whatever has queued (up to what the last transactions'
pace says fits in TARGET_TRANSACTION_S, within MIN_/MAX_ITEMS_PER_TRANSACTION lines and points) and has
its store decode and store it as one transaction: the ingest process (server/live/ingest_process.py, the
default), or a thread of this process (ingest_store.ThreadStore). Then it resolves each batch's future
with its outcome, so the stream acknowledges only what is committed, marks the tasks that made progress
(hang detection), counts what was stored, and wakes the agents the transaction gave commands to.
Exactly-once holds through the unique (task_id, seq) constraints: a resend after a lost ack, or a group
stored again after the ingest process died, inserts nothing. Heartbeats never queue here
(server/live/liveness.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mwms.server.live import outcomes as outcomes_of
from mwms.server.live.ingest_store import GroupStore, RawBatch, StoredGroup
from mwms.server.live.task_progress import TaskProgress
from mwms.server.observability.instruments import count_ingested
from mwms.server.services.observing.telemetry import StoreOutcome

log = logging.getLogger("mwms.server.rpc")
# Bounds one transaction, so a burst is committed (and acknowledged) in steps the agents can see.
MAX_ITEMS_PER_TRANSACTION = 50_000
MIN_ITEMS_PER_TRANSACTION = 1_000
# Every other writer (task reports, the liveness flush, the scheduler process, POST /jobs) waits for the
# database's write lock while a telemetry transaction holds it (on SQLite for its turn: server/db/write_turns.py):
# sized by the pace measured, one holds it about this long. 1 s made a write of the API wait 1.4 s at the
# median behind 50,000 points/s (bench/README.md, ingest); 0.1 s costs the ingest process a commit and two
# reads ten times a second, against storing 10,000 items in each.
TARGET_TRANSACTION_S = 0.1


def items_per_transaction(items: int, seconds: float) -> int:
    """How many items the next transaction takes, after the last stored `items` in `seconds`."""
    if items <= 0 or seconds <= 0:
        return MAX_ITEMS_PER_TRANSACTION
    fitting = int(items / seconds * TARGET_TRANSACTION_S)
    return max(MIN_ITEMS_PER_TRANSACTION, min(MAX_ITEMS_PER_TRANSACTION, fitting))


@dataclass
class _Queued:
    batch: RawBatch
    done: asyncio.Future[StoreOutcome]


class TelemetryWriter:
    """Groups queued batches into transactions run by `store`; a batch's future holds its outcome once
    committed."""

    def __init__(
        self,
        store: GroupStore,
        wake_agents: Callable[[Iterable[str] | None], None],
        on_change: Callable[[], None],
        progress: TaskProgress | None = None,
    ) -> None:
        self.store = store
        self._wake_agents = wake_agents
        self._on_change = on_change
        self._progress = progress  # hang detection's clock: tasks whose lines or points were stored
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self._runner: asyncio.Task[None] | None = None
        self._groups: set[asyncio.Task[None]] = set()  # handed to the store, not settled yet
        self.transactions = 0  # committed transactions (tests, benchmarks)
        self._items_cap = MAX_ITEMS_PER_TRANSACTION

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stops taking batches; those not stored yet are cancelled (their streams are ending), then the store."""
        tasks = [t for t in (self._runner, *self._groups) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().done.cancel()
        await self.store.stop()

    def submit(self, batch: RawBatch) -> asyncio.Future[StoreOutcome]:
        """Queues `batch`; the future holds its outcome once committed, or what storing it raised."""
        done: asyncio.Future[StoreOutcome] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Queued(batch, done))
        return done

    async def _run(self) -> None:
        # The store takes up to `parallel` groups at once (the ingest process reads the next one while it
        # stores one); a slot is taken before the group is formed, so a group grows while it waits.
        slots = asyncio.Semaphore(self.store.parallel)
        while True:
            await slots.acquire()
            group = [await self._queue.get()]
            items = group[0].batch.size
            while items < self._items_cap and not self._queue.empty():
                queued = self._queue.get_nowait()
                group.append(queued)
                items += queued.batch.size
            group = [q for q in group if not q.done.cancelled()]  # streams that ended meanwhile
            if not group:
                slots.release()
                continue
            task = asyncio.create_task(self._store(group, items))
            self._groups.add(task)
            task.add_done_callback(self._groups.discard)
            task.add_done_callback(lambda _: slots.release())

    async def _store(self, group: list[_Queued], items: int) -> None:
        try:
            stored = await self.store.store([q.batch for q in group])
        except asyncio.CancelledError:
            outcomes_of.cancel(q.done for q in group)
            raise
        except Exception as error:  # noqa: BLE001 - each stream decides (a transient error ends it)
            outcomes_of.fail((q.done for q in group), error)
            return
        self.transactions += 1
        self._items_cap = items_per_transaction(items, stored.held_s)
        self._settle(group, stored)

    def _settle(self, group: list[_Queued], stored: StoredGroup) -> None:
        outcomes = stored.outcomes
        if self._progress is not None:
            self._progress.seen(
                q.batch.task_id
                for q, o in zip(group, outcomes, strict=True)
                if isinstance(o, StoreOutcome) and q.batch.size
            )
        _count_ingested(group, outcomes)
        outcomes_of.settle([q.done for q in group], outcomes)
        if stored.answer_lost:
            # What the lost answer said is unknown: every connected agent looks for its commands.
            self._on_change()
            self._wake_agents(None)
            return
        if any(isinstance(o, StoreOutcome) and o.changed for o in outcomes):
            self._on_change()
        if stored.targets:
            self._wake_agents(stored.targets)


def _count_ingested(group: list[_Queued], outcomes: list[StoreOutcome | Exception]) -> None:
    """One increment per kind for the whole transaction: what was stored and acknowledged, not refused."""
    lines = points = 0
    for queued, outcome in zip(group, outcomes, strict=True):
        if isinstance(outcome, StoreOutcome):
            accepted = max(0, queued.batch.size - outcome.rejected)
            if queued.batch.kind == "logs":
                lines += accepted
            else:
                points += accepted
    count_ingested(lines, points)
