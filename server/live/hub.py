"""Connected agent streams, and the one dispatcher that pushes their start and stop commands.

The database stays the source of truth: `wake(agent_ids)` marks agents whose commands may have changed
(the scheduler's placements, a transaction's stops, a hello); one dispatcher task reads the commands of
all marked agents in a fixed number of queries and hands each stream its own. `wake(None)` (a REST
route's stop or removal) marks every connected agent, still one read. A slow sweep over every connected
agent every `sweep_interval_s` is the safety net; streams remember what they sent, so nothing is sent
twice. A stream whose agent was removed is closed by the pass that finds it.

With replicas (server/services/fleet/replicas.py), an agent woken here whose stream another replica holds gets a
ring on the doorbell (server/live/agent_notify.py), and that replica's hub reads its commands; a stream
the database says is not the agent's newest (another replica, or a later epoch, accepted its hello) is
closed by the pass that finds it, so a replica that lost an agent never delivers stale commands.

In-memory, like the rest of server/live/: the gRPC servicers (server/rpc/agent_stream.py) attach their
streams; routers reach it through the wiring (server/live/wiring.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

from mwms.server.db.engine import Database
from mwms.server.live.agent_notify import Doorbell
from mwms.server.services.fleet import agent_messages

log = logging.getLogger("mwms.server.rpc")
SWEEP_ALONE_S = 30.0
SWEEP_WITH_REPLICAS_S = 5.0
# While the doorbell's listener is reconnecting, rings may be missed: sweep this often meanwhile.
SWEEP_DEAF_S = 1.0


class CommandSink(Protocol):
    """What the hub needs of an agent's stream (server/rpc/agent_stream.py)."""

    ready: bool  # the agent said hello, so it knows what it runs: commands may flow
    epoch: (
        int | None
    )  # the stream epoch its hello claimed (server/services/fleet/replicas.py); None: none yet

    async def deliver(self, commands: agent_messages.Commands) -> None: ...

    async def ask_stacks(self, request_id: str, task_ids: list[str]) -> None: ...

    def close(self, reason: str, superseded: bool = False) -> None: ...


class AgentHub:
    """Knows which agents have a live stream and pushes commands to the ones a change concerns."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        db: Database,
        sweep_interval_s: float | None = None,
        *,
        replica_id: str = "",
        doorbell: Doorbell | None = None,
    ) -> None:
        self._loop = loop
        self._db = db
        self.replica_id = replica_id
        self._doorbell = doorbell if doorbell is not None and doorbell.enabled else None
        if sweep_interval_s is None:
            # A lost ring (a replica killed between its commit and its NOTIFY) waits for the sweep.
            sweep_interval_s = SWEEP_WITH_REPLICAS_S if self._doorbell is not None else SWEEP_ALONE_S
        self._sweep_interval_s = sweep_interval_s
        self._owners: dict[str, CommandSink] = {}
        self._marked: set[str] = set()
        self._mark_all = False
        self._ring_all = False  # wake(None): the other replicas' agents too
        self._unheld: set[str] = set()  # woken here, held elsewhere (or nowhere): rung for
        self._work = asyncio.Event()
        self._deliveries: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self.passes = 0  # dispatcher passes that read the database (tests, benchmarks)

    def attach(self, agent_id: str, owner: CommandSink) -> None:
        """Registers a stream as the agent's current one."""
        self._owners[agent_id] = owner

    def detach(self, agent_id: str, owner: object) -> None:
        if self._owners.get(agent_id) is owner:
            del self._owners[agent_id]

    def is_current(self, agent_id: str, owner: object) -> bool:
        return self._owners.get(agent_id) is owner

    def connected(self) -> set[str]:
        return set(self._owners)

    def connected_count(self) -> int:
        """Agents with a live stream; safe from any thread (no iteration)."""
        return len(self._owners)

    async def ask_stacks(self, agent_id: str, request_id: str, task_ids: list[str]) -> bool:
        """Asks the agent, on its current stream, for the stacks of `task_ids`; False when it has no
        stream that takes commands, or the send failed."""
        owner = self._owners.get(agent_id)
        if owner is None or not owner.ready:
            return False
        try:
            await owner.ask_stacks(request_id, task_ids)
        except Exception as error:  # noqa: BLE001 - a broken stream answers nothing; its reader ends it
            log.info("could not ask agent %s for stacks: %s", agent_id, error)
            return False
        return True

    def wake(self, agent_ids: Iterable[str] | None = None) -> None:
        """Pushes the pending commands of the given agents (every connected one when None), wherever their
        streams are; any thread."""
        ids = None if agent_ids is None else list(agent_ids)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._mark(ids, ring=True)
        else:
            self._loop.call_soon_threadsafe(self._mark, ids, True)

    def wake_local(self, agent_ids: list[str]) -> None:
        """A ring from another replica (event loop only): wakes the named agents this replica holds."""
        self._mark(None if "*" in agent_ids else agent_ids, ring=False)

    def _mark(self, ids: list[str] | None, ring: bool) -> None:
        if ids is None:
            self._mark_all = True
            self._ring_all = self._ring_all or (ring and self._doorbell is not None)
        elif not ids:
            return
        else:
            self._marked.update(ids)
            if ring and self._doorbell is not None:
                self._unheld.update(i for i in ids if i not in self._owners)
        self._work.set()

    def _sweep_interval(self) -> float:
        if self._doorbell is not None and not self._doorbell.listening.is_set():
            return min(self._sweep_interval_s, SWEEP_DEAF_S)
        return self._sweep_interval_s

    def _ring(self) -> None:
        """Rings the other replicas for the agents woken here whose streams this replica does not hold."""
        unheld, self._unheld = self._unheld, set()
        every, self._ring_all = self._ring_all, False
        if self._doorbell is None or not (unheld or every):
            return
        ring = self._doorbell.ring("agents", ["*"] if every else sorted(unheld))
        task = asyncio.create_task(ring)
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._runner, *self._deliveries) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._work.wait(), timeout=self._sweep_interval())
            except TimeoutError:
                self._mark_all = True  # the safety sweep
            self._work.clear()
            self._ring()
            marked, self._marked = self._marked, set()
            every, self._mark_all = self._mark_all, False
            targets = sorted(
                agent_id
                for agent_id, owner in self._owners.items()
                if owner.ready and (every or agent_id in marked)
            )
            if not targets:
                continue
            try:
                await self.dispatch(targets)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a dead dispatcher would leave every agent without commands
                log.exception("dispatching commands to %d agent(s) failed; retrying", len(targets))
                self._marked.update(targets)
                self._work.set()
                await asyncio.sleep(1.0)

    async def dispatch(self, agent_ids: list[str]) -> None:
        """One pass: reads the commands of `agent_ids` and hands each current stream its own."""

        def read() -> agent_messages.PendingCommands:
            with self._db.read() as session:
                return agent_messages.pending_commands(session, agent_ids)

        pending = await asyncio.to_thread(read)
        self.passes += 1
        for agent_id, reason in pending.refused.items():
            owner = self._owners.get(agent_id)
            if owner is not None:
                owner.close(reason)
        superseded = set()
        for agent_id, (holder, epoch) in pending.streams.items():
            owner = self._owners.get(agent_id)
            if owner is None or owner.epoch is None or holder is None:
                continue
            if holder != self.replica_id or epoch != owner.epoch:
                superseded.add(agent_id)
                owner.close(
                    f"agent {agent_id} has a newer stream (epoch {epoch} on replica {holder}); this one "
                    f"(epoch {owner.epoch}) takes no more commands",
                    superseded=True,
                )
        for agent_id, commands in pending.by_agent.items():
            owner = self._owners.get(agent_id)
            if owner is None or not owner.ready or agent_id in superseded:
                continue  # gone meanwhile: its next hello asks again
            # Each stream sends on its own task, so one slow agent never holds up the others' commands.
            delivery = asyncio.create_task(owner.deliver(commands))
            self._deliveries.add(delivery)
            delivery.add_done_callback(self._deliveries.discard)
