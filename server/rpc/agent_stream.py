"""One agent's Connect stream: a reader applying its messages; commands arrive from the hub (server/live/hub.py).

Every message marks the agent alive in memory (server/live/liveness.py); a heartbeat is answered at once and
writes nothing. Log and metric batches go through the shared telemetry writer (server/live/ingest.py)
and are acknowledged once committed; hellos through the shared hello writer (server/live/hello_writer.py).
Task reports are one transaction each, applied once the batches the agent sent before them are stored (a
failure's reason quotes the task's last lines); the agents their changes give commands to are woken, and
only those. A goodbye (the agent's last message on a clean stop)
is applied in order like a report, after everything the agent sent before it: the agent then reads as
stopped, not lost, and this stream takes no more commands. A message of a kind this coordinator does not
know (from a newer agent) is ignored, and logged once per stream.

A message that cannot be applied never ends the stream (which would make the agent reconnect and resend
it forever): a log or metric batch is acknowledged with what was refused and why, so the agent drops it;
a task report is skipped. A start command that cannot be built or would not fit the agent's receive limit
fails its job with the reason. Each is logged and counted (mwms.server.poison). Only a refused credential and
database trouble end the stream.
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
from mwms.server.observability.instruments import count_command, observe_heartbeat_round_trip
from mwms.server.poison import contain, count_poison, is_transient
from mwms.server.rpc import convert
from mwms.server.rpc.status import grpc_status
from mwms.server.services.fleet import agent_messages, replicas
from mwms.server.services.fleet.command_targets import track_command_targets
from mwms.server.services.job_life import start_commands
from mwms.server.services.observing import preflight
from mwms.server.services.observing.telemetry import StoreOutcome
from mwms.v1 import agent_pb2 as pb

log = logging.getLogger("mwms.server.rpc")
T = TypeVar("T")
HEARTBEAT_ACK = pb.CoordinatorMessage(ack=pb.Ack())
# Log and metric batches of one stream (both kinds together) being stored at once; past it the reader waits
# (backpressure on the agent), so one agent cannot queue unbounded work and memory on the coordinator.
MAX_UNACKED_BATCHES = 32
# Messages read and waiting to be applied, per stream; past it the reader waits.
MAX_PENDING_MESSAGES = 64
# While the reader waits (for a slot, or for room among the pending messages), the agent is marked alive
# this often.
SLOT_WAIT_BEAT_S = 1.0


class AgentStream:
    """The stream of the agent the call's credential proved (never the id an agent claims in a message)."""

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

    async def ask_stacks(self, request_id: str, task_ids: list[str]) -> None:
        """Asks the agent for the stacks of these tasks (server/live/stack_collector.py)."""
        await self.send(convert.dump_stacks(request_id, task_ids))

    def close(self, reason: str, superseded: bool = False) -> None:
        """Ends the stream with `reason`: UNAUTHENTICATED (the agent may no longer talk), or ABORTED when
        the agent has a newer stream (`superseded`); loop thread only."""
        self._close_reason = reason
        self._close_code = grpc.StatusCode.ABORTED if superseded else grpc.StatusCode.UNAUTHENTICATED
        self._closed.set()

    async def run(self) -> None:
        hub = self.wiring.hub
        hub.attach(self.agent_id, self)
        reader = asyncio.create_task(self._read())
        acker = asyncio.create_task(self._acknowledge())
        closing = asyncio.create_task(self._closed.wait())
        try:
            await asyncio.wait({reader, acker, closing}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # the agent ended the stream, or a message could not be applied
                # Batches read before the end are still acknowledged, or end the stream with their error.
                self._unacked.put_nowait(None)
                await asyncio.wait({acker, closing}, return_when=asyncio.FIRST_COMPLETED)
            if acker.done():
                acker.result()  # a batch could not be stored: the database is in trouble, or the agent removed
            elif closing.done():
                log.warning("closing the stream of agent %s: %s", self.agent_id, self._close_reason)
                await self.context.abort(self._close_code, self._close_reason)
        except DomainError as error:
            await self.context.abort(grpc_status(error), str(error))
        finally:
            hub.detach(self.agent_id, self)
            if self.epoch is not None and self._close_code != grpc.StatusCode.ABORTED:
                self._release_stream(self.epoch)
            for task in (reader, acker, closing):
                task.cancel()  # a no-op for a finished task, whose outcome the await below collects
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the stream is over either way
                    pass

    def _release_stream(self, epoch: int) -> None:
        """Says in the database that this stream ended (best effort: a replica that dies cannot, and its
        streams end with its beats, server/services/fleet/replicas.py)."""

        def run() -> None:
            with self.wiring.db.write() as session:
                replicas.release_stream(session, self.agent_id, self.wiring.replica.id, epoch)

        async def release() -> None:
            try:
                await asyncio.to_thread(run)
            except Exception as error:  # noqa: BLE001 - the holder's beats end with it anyway
                log.info("could not record the end of agent %s's stream: %r", self.agent_id, error)

        task = asyncio.create_task(release())
        self.wiring.background.add(task)
        task.add_done_callback(self.wiring.background.discard)

    async def _read(self) -> None:
        """Reads the stream and answers heartbeats at once; every other message is applied in order by
        `_work`, so a heartbeat (and the agent's liveness) never waits behind a write that waits for the
        database, however busy its writer lock is across the replicas."""
        reading = asyncio.create_task(self._read_messages())
        working = asyncio.create_task(self._work())
        try:
            done, _ = await asyncio.wait({reading, working}, return_when=asyncio.FIRST_COMPLETED)
            if working in done:
                working.result()  # a message the stream cannot outlive (a refused credential, the database)
            reading.result()  # the agent ended the stream: what it sent before is applied first
            await working
        finally:
            for task in (reading, working):
                task.cancel()
            await asyncio.gather(reading, working, return_exceptions=True)

    async def _read_messages(self) -> None:
        while True:
            message = await self.context.read()
            if message is grpc.aio.EOF:
                break
            if not self.wiring.hub.is_current(self.agent_id, self):
                log.warning("agent %s opened a newer stream; closing this one", self.agent_id)
                break
            self.wiring.liveness.seen(self.agent_id)  # any message proves the agent alive
            if message.WhichOneof("body") == "heartbeat":
                await self.send(HEARTBEAT_ACK)  # lets the agent tell a live stream from a dead one
                observe_heartbeat_round_trip(message.heartbeat.last_round_trip_ms)
                continue
            await self._queue_for_work(message)
        await self._queue_for_work(None)

    async def _queue_for_work(self, message: pb.AgentMessage | None) -> None:
        """Hands a message to `_work`; while MAX_PENDING_MESSAGES wait, the reader waits too (backpressure
        on the agent), and the agent, waiting on this coordinator rather than silent, is kept alive."""
        while True:
            try:
                await asyncio.wait_for(self._pending.put(message), timeout=SLOT_WAIT_BEAT_S)
                return
            except TimeoutError:
                self.wiring.liveness.seen(self.agent_id)

    async def _work(self) -> None:
        while (message := await self._pending.get()) is not None:
            body = message.WhichOneof("body")
            try:
                await self._apply(message, body)
            except (DomainError, grpc.RpcError):
                raise  # a refused credential, or the stream itself is gone
            except Exception as error:  # noqa: BLE001 - one bad message must not end the stream
                if is_transient(error):
                    raise  # the database is in trouble: the agent resends once it reconnects
                await self._refuse(message, body)

    async def _apply(self, message: pb.AgentMessage, body: str | None) -> None:
        settings = self.settings
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
                replies = await self._write_tracked(
                    agent_messages.accept_report,
                    self.agent_id,
                    report,
                    backoff_base_s=settings.restart_backoff_s,
                )
                await self._reply(replies)
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
        refused (the agent drops it), unless the database is in trouble or the agent was removed."""
        while (item := await self._unacked.get()) is not None:
            message, body, store = item
            try:
                stored = await store
            except (DomainError, asyncio.CancelledError):
                raise
            except Exception as error:  # noqa: BLE001 - one bad batch must not end the stream
                if is_transient(error):
                    raise  # the agent resends once it reconnects
                self._unacked_slots.release()
                # The ingest process says what it could not do (a batch that does not decode, one that
                # killed the process); anything else is an internal error, logged here.
                await self._refuse(message, body, str(error) if isinstance(error, IngestItemError) else "")
                continue
            self._unacked_slots.release()
            if body == "logs":
                await self.send(convert.ack(message.logs.task_id, log_seq=stored.acked_seq, stored=stored))
            else:
                await self.send(
                    convert.ack(message.metrics.task_id, metric_seq=stored.acked_seq, stored=stored)
                )

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

    async def deliver(self, commands: agent_messages.Commands) -> None:
        """Sends the start and stop commands not sent on this stream yet (called by the hub)."""
        try:
            async with self._deliver_lock:  # keeps one pass's starts ahead of a later pass's stops
                for task, job in commands.starts:
                    if task.id not in self.sent_starts:
                        self.sent_starts.add(task.id)
                        command = await self._start_command(task, job, commands.guarded_ports)
                        if command is not None:
                            await self.send(command)
                            count_command("start")
                for task in commands.stops:
                    if task.id not in self.sent_stops:
                        self.sent_stops.add(task.id)
                        await self.send(convert.stop_task(task, self.settings.stop_grace_s))
                        count_command("stop")
        except grpc.RpcError:
            pass  # the stream is gone; its reader ends the stream and the next hello asks again
        except Exception:  # noqa: BLE001 - one agent's trouble must not reach the hub
            log.exception("sending commands to agent %s failed", self.agent_id)

    async def _start_command(
        self, task: Any, job: Any, agent_ranges: list[tuple[int, int]]
    ) -> pb.CoordinatorMessage | None:
        """The StartTask for `task`, or None when it cannot go out (the service then fails its job).

        Built and measured here (a message's size is the transport's to know); whether it is refused, and
        why, is the service's."""
        try:
            settings = self.settings
            defaults = start_commands.StartDefaults(
                stop_grace_s=settings.stop_grace_s,
                preemption_grace_s=settings.preemption_grace_s,
                shared_checkpoint_dir=settings.shared_checkpoint_dir,
                preflight=settings.preflight,
                preflight_timeout_s=settings.preflight_timeout_s,
                preflight_allreduce=settings.preflight_allreduce,
                own_ports=(settings.http_port, settings.grpc_port),
            )
            command = convert.start_task(start_commands.start_spec(task, job, defaults, agent_ranges))
        except Exception as error:  # noqa: BLE001 - a damaged job row must not stop this agent's commands
            contain(log, "start_task", task.id, f"the start command of task {task.id} (job {job.id})")
            reason = start_commands.unbuildable_reason(error)
        else:
            oversize = start_commands.oversize_reason(command.ByteSize())
            if oversize is None:
                return command
            reason = oversize
            count_poison("start_task")
            log.warning("task %s of job %s: %s", task.id, job.id, reason)
        changed, targets = await self._write_tracked(agent_messages.refuse_start, task.id, reason)
        if changed:
            self.wiring.poke_scheduler()
        if targets:
            self.wiring.hub.wake(targets)
        return None
