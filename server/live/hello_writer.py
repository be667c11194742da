"""One writer for the hellos of every agent's stream: hellos that arrive together share one transaction.

A hello (an agent that reconnected says what it runs) is a read-then-write transaction under the
database's writer lock (server/db/engine.py). After a replica dies, hundreds of its agents say hello to
the survivors within a second or two, and one transaction each would line them up behind that lock one
commit at a time. So streams queue their hellos (`submit`) and this writer applies whatever has queued, up
to MAX_HELLOS_PER_TRANSACTION, in one transaction: each hello in a savepoint of its own, so one that
cannot be applied (a removed agent, a damaged row) fails alone with its own error, as it would on its own.
Each stream gets its replies and its new stream epoch (server/services/fleet/replicas.py) once committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mwms.server.db.engine import Database
from mwms.server.live import outcomes as outcomes_of
from mwms.server.poison import is_transient
from mwms.server.services.fleet import agent_messages, replicas
from mwms.server.services.fleet.command_targets import track_command_targets
from mwms.server.services.job_life.tasks import TaskReport
from mwms.server.settings import Settings

log = logging.getLogger("mwms.server.rpc")
MAX_HELLOS_PER_TRANSACTION = 200
Accepted = tuple[agent_messages.Replies, int]  # the replies to send, and the stream's epoch


@dataclass
class _Queued:
    agent_id: str
    reports: list[TaskReport]
    done: asyncio.Future[Accepted]


class HelloWriter:
    """Groups queued hellos into transactions; a hello's future holds its outcome once committed."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        replica_id: str,
        wake_agents: Callable[[Iterable[str]], None],
        on_change: Callable[[], None],
    ) -> None:
        self._db = db
        self._settings = settings
        self._replica_id = replica_id
        self._wake_agents = wake_agents
        self._on_change = on_change
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
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

    def submit(self, agent_id: str, reports: list[TaskReport]) -> asyncio.Future[Accepted]:
        """Queues the hello of `agent_id`; its future holds (replies, epoch), or what applying it raised."""
        done: asyncio.Future[Accepted] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Queued(agent_id, reports, done))
        return done

    async def _run(self) -> None:
        while True:
            group = [await self._queue.get()]
            while len(group) < MAX_HELLOS_PER_TRANSACTION and not self._queue.empty():
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
            if any(not isinstance(o, BaseException) and o[0].changed for o in outcomes):
                self._on_change()
            if targets:
                self._wake_agents(targets)

    def _write(self, group: list[_Queued]) -> tuple[list[Accepted | Exception], set[str]]:
        settings = self._settings
        outcomes: list[Accepted | Exception | None] = [None] * len(group)
        with self._db.write() as session:
            targets = track_command_targets(session)
            # In agent id order, as liveness flushes lock agents (BackgroundLoops.flush_liveness): they do
            # not wait for the writer lock, and rows taken in two orders would deadlock.
            for at in sorted(range(len(group)), key=lambda i: group[i].agent_id):
                queued = group[at]
                try:
                    with session.begin_nested():
                        replies = agent_messages.accept_hello(
                            session,
                            queued.agent_id,
                            queued.reports,
                            timeout_s=settings.agent_timeout_s,
                            backoff_base_s=settings.restart_backoff_s,
                        )
                        epoch = replicas.claim_stream(session, queued.agent_id, self._replica_id)
                except Exception as error:  # noqa: BLE001 - this hello fails alone, as it would on its own
                    if is_transient(error):
                        raise
                    outcomes[at] = error
                else:
                    outcomes[at] = (replies, epoch)
        return [o for o in outcomes if o is not None], targets
