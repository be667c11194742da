"""How the messages of one agent's Connect stream are applied: the stream's state, and each kind of message.

A hello goes through the shared hello writer (server/live/hello_writer.py); log and metric batches through
the shared telemetry writer (server/live/ingest.py), at most MAX_UNACKED_BATCHES of a stream at once, and
are acknowledged in order once committed. Task reports go through the shared report writer
(server/live/report_writer.py), goodbyes are one transaction each, both applied once the batches the agent
sent before them are stored; the agents their changes give commands to are woken, and only those. A
message that cannot be applied is contained (`_refuse`): a batch is acknowledged as refused, so the agent
drops it. Reading the stream and sending commands is server/rpc/agent_stream.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from mwms.server.errors import DomainError
from mwms.server.live.ingest_store import RawBatch
from mwms.server.live.ingest_wire import IngestItemError
from mwms.server.live.wiring import Wiring
from mwms.server.poison import contain, is_transient
from mwms.server.rpc import convert
from mwms.server.services.fleet import agent_messages
from mwms.server.services.fleet.command_targets import track_command_targets
from mwms.server.services.observing import preflight
from mwms.server.services.observing.telemetry import StoreOutcome
from mwms.v1 import agent_pb2 as pb

log = logging.getLogger("mwms.server.rpc")
T = TypeVar("T")
_NOTHING = object()  # no message carried over to the acknowledger's next round
# Log and metric batches of one stream (both kinds together) being stored at once; past it the reader waits
# (backpressure on the agent), so one agent cannot queue unbounded work and memory on the coordinator.
MAX_UNACKED_BATCHES = 32
# Messages read and waiting to be applied, per stream; past it the reader waits.
MAX_PENDING_MESSAGES = 64
# While the reader waits (for a slot, or for room among the pending messages), the agent is marked alive
# this often.
SLOT_WAIT_BEAT_S = 1.0


class MessageApplier:
    """The state of the stream of the agent the call's credential proved (never the id an agent claims in
    a message), and how each message read from it is applied (server/rpc/agent_stream.py reads them)."""

    def __init__(self, wiring: Wiring, agent_id: str, context: grpc.aio.ServicerContext) -> None:
        self.wiring = wiring
        self.agent_id = agent_id
        self.context = context
        self.settings = wiring.settings
        self.sent_starts: set[str] = set()
        self.sent_stops: set[str] = set()
        self.ready = False  # commands flow once the agent said hello (it then knows what it runs)
        self.epoch: int | None = (
            None  # the stream epoch its hello claimed (server/services/fleet/replicas.py)
        )
        self._unknown_logged = False
        self.write_lock = asyncio.Lock()
        self._deliver_lock = asyncio.Lock()
        # Batches handed to the telemetry writer, acknowledged in order once committed; the reader reads
        # on meanwhile, so a heartbeat never waits behind this agent's own logs and metrics.
        self._unacked: asyncio.Queue[tuple[pb.AgentMessage, str, asyncio.Future[StoreOutcome]] | None] = (
            asyncio.Queue()
        )
        self._unacked_slots = asyncio.Semaphore(MAX_UNACKED_BATCHES)
        # Batches handed to the writer and not stored yet: a report or goodbye waits for them (`_after_batches`).
        self._storing: set[asyncio.Future[StoreOutcome]] = set()
        # Messages read and not applied yet (all but heartbeats, which the reader answers itself).
        self._pending: asyncio.Queue[pb.AgentMessage | None] = asyncio.Queue(MAX_PENDING_MESSAGES)
        self._closed = asyncio.Event()
        self._close_reason = ""
        self._close_code = grpc.StatusCode.UNAUTHENTICATED

    async def _write_tracked(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, set[str]]:
        """`fn` in a write transaction; also returns the agents it gave commands to (to wake them)."""

        def run() -> tuple[T, set[str]]:
            with self.wiring.db.write() as session:
                targets = track_command_targets(session)
                result = fn(session, *args, **kwargs)
            return result, targets

        return await asyncio.to_thread(run)

    async def send(self, message: pb.CoordinatorMessage) -> None:
        async with self.write_lock:
            await self.context.write(message)

    async def _apply(self, message: pb.AgentMessage, body: str | None) -> None:
        wiring = self.wiring
        if body == "hello":
            if message.hello.agent_id and message.hello.agent_id != self.agent_id:
                log.warning(
                    "agent %s says hello as %r; its credential decides", self.agent_id, message.hello.agent_id
                )
            reports = [r for r in map(convert.task_report, message.hello.tasks) if r is not None]
            try:
                # Applied with the hellos of other streams that came at the same time (a failover).
                answer, self.epoch = await wiring.hellos.submit(self.agent_id, reports)
                replies = (answer, set[str]())  # the writer woke the agents its transaction gave commands to
            finally:
                # Commands flow once the agent said what it already runs, even after a hello that failed.
                self.sent_starts.clear()
                self.sent_stops.clear()
                self.ready = True
                wiring.hub.wake([self.agent_id])
            await self._reply(replies)
        elif body == "task":
            report = convert.task_report(message.task)
            if report is not None:
                await self._after_batches()
                # Applied with the reports of other streams that came at the same time (a gang starting);
                # the writer woke the agents its transaction gave commands to.
                answer = await wiring.reports.submit(self.agent_id, report)
                await self._reply((answer, set()))
        elif body in ("logs", "metrics"):
            await self._submit_batch(message, body)
        elif body == "preflight":
            # Stored only: a failed check's task report (which follows) ends the attempt.
            await self._write_tracked(
                preflight.store_result, self.agent_id, convert.preflight_result(message.preflight)
            )
        elif body == "devices":
            # Best effort: checked and queued (server/live/device_ingest.py), never acknowledged.
            await wiring.devices.accept(self, self.agent_id, convert.device_samples(message.devices))
        elif body == "stacks":
            await wiring.stacks.accept(self.agent_id, convert.stack_dump(message.stacks))
        elif body == "goodbye":
            await self._after_batches()
            stopped, _ = await self._write_tracked(
                agent_messages.accept_goodbye,
                self.agent_id,
                message.goodbye.reason,
                replica_id=wiring.replica.id,
                epoch=self.epoch,
            )
            if stopped:
                self.ready = False  # it is stopping: no more commands on this stream
        elif not self._unknown_logged:
            # A newer agent's message (an unknown field of the oneof reads as no body): nothing to apply.
            self._unknown_logged = True
            log.info("agent %s sent a message this coordinator does not know; ignoring those", self.agent_id)

    async def _submit_batch(self, message: pb.AgentMessage, body: str) -> None:
        """Hands a log or metric batch to the telemetry writer, once fewer than MAX_UNACKED_BATCHES of this
        stream (logs and metrics together) wait for their acknowledgement; till then the reader waits.

        The batch goes as its serialized bytes: it is decoded item by item where it is stored (the ingest
        process), never in this event loop."""
        if body == "logs":
            part: pb.LogBatch | pb.MetricBatch = message.logs
            size = len(message.logs.lines)
        else:
            part = message.metrics
            size = len(message.metrics.points)
        batch = RawBatch(self.agent_id, part.task_id, body, part.SerializeToString(), size)
        await self._wait_for_a_slot()
        try:
            store = self.wiring.telemetry.submit(batch)
        except BaseException:
            self._unacked_slots.release()
            raise
        self._storing.add(store)
        store.add_done_callback(self._storing.discard)
        self._unacked.put_nowait((message, body, store))

    async def _after_batches(self) -> None:
        """Waits until every batch this stream handed to the writer is stored (or refused), so a report is
        applied after the lines the agent sent before it: a failure's reason quotes the task's last lines
        and a job reads as ended only with its whole log. How each batch fared is the acknowledger's."""
        if self._storing:
            await asyncio.wait(set(self._storing))

    async def _wait_for_a_slot(self) -> None:
        """Waits for one of the stream's MAX_UNACKED_BATCHES slots. Meanwhile nothing more is read from the
        stream, its heartbeats included; the agent is waiting on this coordinator, not silent, so it is
        kept alive while it waits (a slow writer, a busy database, must never make its agents lost)."""
        while True:
            try:
                await asyncio.wait_for(self._unacked_slots.acquire(), timeout=SLOT_WAIT_BEAT_S)
                return
            except TimeoutError:
                self.wiring.liveness.seen(self.agent_id)

    async def _acknowledge(self) -> None:
        """Acknowledges stored batches in the order they came; a batch that could not be stored is
        refused (the agent drops it), unless the database is in trouble or the agent was removed.

        The batches stored by the time the first of them is (one transaction stores many) are
        acknowledged together: one Ack per task with the highest log and metric seq stored, each of
        which says "everything up to here" (an agent streaming logs and metrics got an Ack per batch,
        the coordinator's costliest message to write after heartbeats'). A batch with refused items
        keeps an Ack of its own, as its reason is that batch's."""
        carried: Any = _NOTHING
        while True:
            item = await self._unacked.get() if carried is _NOTHING else carried
            if item is None:
                return
            await asyncio.wait({item[2]})
            ready, carried = [item], _NOTHING
            while not self._unacked.empty():
                following = self._unacked.get_nowait()
                if following is None or not following[2].done():
                    carried = following
                    break
                ready.append(following)
            await self._acknowledge_stored(ready)

    async def _acknowledge_stored(
        self, ready: list[tuple[pb.AgentMessage, str, asyncio.Future[StoreOutcome]]]
    ) -> None:
        merged: dict[str, list[int]] = {}  # task id -> [log seq, metric seq] to acknowledge together
        for message, body, store in ready:
            try:
                stored = store.result()
            except (DomainError, asyncio.CancelledError):
                raise
            except Exception as error:  # noqa: BLE001 - one bad batch must not end the stream
                if is_transient(error):
                    raise  # the agent resends once it reconnects
                self._unacked_slots.release()
                await self._send_acks(merged)
                # The ingest process says what it could not do (a batch that does not decode, one that
                # killed the process); anything else is an internal error, logged here.
                await self._refuse(message, body, str(error) if isinstance(error, IngestItemError) else "")
                continue
            self._unacked_slots.release()
            logs = body == "logs"
            task_id = message.logs.task_id if logs else message.metrics.task_id
            if stored.rejected:
                await self._send_acks(merged)
                seq = stored.acked_seq
                await self.send(
                    convert.ack(
                        task_id, log_seq=seq if logs else 0, metric_seq=0 if logs else seq, stored=stored
                    )
                )
                continue
            seqs = merged.setdefault(task_id, [0, 0])
            seqs[not logs] = max(seqs[not logs], stored.acked_seq)
        await self._send_acks(merged)

    async def _send_acks(self, merged: dict[str, list[int]]) -> None:
        """One Ack per task of `merged` (its log and metric seqs), in the order the tasks came; empties it."""
        for task_id, (log_seq, metric_seq) in merged.items():
            await self.send(convert.ack(task_id, log_seq=log_seq, metric_seq=metric_seq))
        merged.clear()

    async def _refuse(self, message: pb.AgentMessage, body: str | None, why: str = "") -> None:
        """Contains a message that could not be applied: a batch is acknowledged as refused (with `why`,
        when there is more to say than "an internal error"), so the agent drops it instead of resending it
        forever; a report or hello is skipped (logged and counted)."""
        what = f"a {body} message from agent {self.agent_id}"
        contain(log, f"agent_{body}", f"{self.agent_id}/{body}", what)
        reason = f"the coordinator could not store this batch: {why}"
        if not why:
            reason = "the coordinator could not store this batch (an internal error, logged there)"
        if body == "logs":
            batch = message.logs
            refused = StoreOutcome(max((x.seq for x in batch.lines), default=0), len(batch.lines), reason)
            await self.send(convert.ack(batch.task_id, log_seq=refused.acked_seq, stored=refused))
        elif body == "metrics":
            points = message.metrics
            refused = StoreOutcome(max((x.seq for x in points.points), default=0), len(points.points), reason)
            await self.send(convert.ack(points.task_id, metric_seq=refused.acked_seq, stored=refused))

    async def _reply(self, replies: tuple[agent_messages.Replies, set[str]]) -> None:
        answer, targets = replies
        for task_id in answer.final_acks:
            await self.send(convert.ack(task_id, final_state=True))
        for task_id in answer.stop_ids:
            await self.send(convert.stop_unknown(task_id, self.settings.stop_grace_s))
        if answer.changed:
            self.wiring.poke_scheduler()
        if targets:
            self.wiring.hub.wake(targets)
