"""Writes that the agents' streams queue share transactions: whatever queued while the last one was written
goes into the next, up to a bound, each item in a savepoint of its own.

A task report or a hello is a short read-then-write transaction under the database's writer lock
(server/db/engine.py). A 64-worker job's agents report starting and running within the same second, and
after a replica dies hundreds of agents say hello to the survivors at once: one transaction each lined them
up behind that lock one commit at a time (on SQLite, 32 threads waited in line in bench/sharing.py's scale
scenario). So streams `submit` items and one writer applies what has queued, in agent id order (the order in
which liveness flushes lock agents: rows taken in two orders would deadlock on PostgreSQL). An item that
cannot be applied (a removed agent, a damaged row) fails alone with its own error, as it would on its own;
a database that cannot be written at all fails the whole group, and each stream decides what that means.
Each item's future holds its outcome once committed; the agents the transaction gave commands to are woken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy.orm import Session

from mwms.server.db.engine import Database
from mwms.server.live import outcomes as outcomes_of
from mwms.server.poison import is_transient
from mwms.server.services.fleet.command_targets import track_command_targets

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


@dataclass
class _Queued(Generic[Item, Outcome]):
    agent_id: str
    item: Item
    done: asyncio.Future[Outcome]


class GroupedWrites(Generic[Item, Outcome]):
    """Groups queued items into transactions; `apply(session, agent_id, item)` writes one of them."""

    def __init__(
        self,
        db: Database,
        apply: Callable[[Session, str, Item], Outcome],
        wake_agents: Callable[[Iterable[str]], None],
        max_per_transaction: int,
        committed: Callable[[Sequence[Outcome | BaseException]], None] = lambda outcomes: None,
        prepare: Callable[[Session, list[tuple[str, Item]]], object] = lambda session, items: None,
    ) -> None:
        self._db = db
        self._apply = apply
        self._prepare = prepare  # reads the group's rows in bulk; what it returns is held until the commit
        self._wake_agents = wake_agents
        self._max = max_per_transaction
        self._committed = committed  # told every group's outcomes once committed
        self._queue: asyncio.Queue[_Queued[Item, Outcome]] = asyncio.Queue()
        self._runner: asyncio.Task[None] | None = None
        self.transactions = 0  # committed transactions (tests, benchmarks)

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().done.cancel()

    def submit(self, agent_id: str, item: Item) -> asyncio.Future[Outcome]:
        """Queues `item` of `agent_id`'s stream; its future holds the outcome, or what applying it raised."""
        done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Queued(agent_id, item, done))
        return done

    async def _run(self) -> None:
        while True:
            group = [await self._queue.get()]
            while len(group) < self._max and not self._queue.empty():
                group.append(self._queue.get_nowait())
            group = [q for q in group if not q.done.cancelled()]  # streams that ended meanwhile
            if not group:
                continue
            try:
                outcomes, targets = await asyncio.to_thread(self._write, group)
            except asyncio.CancelledError:
                outcomes_of.cancel(q.done for q in group)
                raise
            except Exception as error:  # noqa: BLE001 - each stream decides (a transient error ends it)
                outcomes_of.fail((q.done for q in group), error)
                continue
            self.transactions += 1
            outcomes_of.settle([q.done for q in group], outcomes)
            self._committed(outcomes)
            if targets:
                self._wake_agents(targets)

    def _write(self, group: list[_Queued[Item, Outcome]]) -> tuple[list[Outcome | Exception], set[str]]:
        outcomes: dict[int, Outcome | Exception] = {}
        with self._db.write() as session:
            targets = track_command_targets(session)
            # What `prepare` loaded stays referenced, so the session's identity map (weak references)
            # answers the items' reads of those rows instead of a round trip each.
            loaded = self._prepare(session, [(q.agent_id, q.item) for q in group])
            # A stable sort: one agent's items keep the order its streams queued them in.
            for at in sorted(range(len(group)), key=lambda i: group[i].agent_id):
                queued = group[at]
                try:
                    with session.begin_nested():
                        outcomes[at] = self._apply(session, queued.agent_id, queued.item)
                except Exception as error:  # noqa: BLE001 - this item fails alone, as it would on its own
                    if is_transient(error):
                        raise
                    outcomes[at] = error
            del loaded
        return [outcomes[at] for at in range(len(group))], targets
