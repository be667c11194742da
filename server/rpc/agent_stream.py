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

This module reads the stream (answering heartbeats itself), hands every other message in order to the
applier and sends the hub's commands; how each message is applied, and the stream's state, is
server/rpc/agent_stream_apply.py's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from mwms.server.errors import DomainError
from mwms.server.observability.instruments import count_command, observe_heartbeat_round_trip
from mwms.server.poison import contain, count_poison, is_transient
from mwms.server.rpc import convert
from mwms.server.rpc.agent_stream_apply import MAX_PENDING_MESSAGES as MAX_PENDING_MESSAGES
from mwms.server.rpc.agent_stream_apply import MAX_UNACKED_BATCHES as MAX_UNACKED_BATCHES
from mwms.server.rpc.agent_stream_apply import SLOT_WAIT_BEAT_S as SLOT_WAIT_BEAT_S
from mwms.server.rpc.agent_stream_apply import MessageApplier
from mwms.server.rpc.status import grpc_status
from mwms.server.services.fleet import agent_messages, replicas
from mwms.server.services.job_life import start_commands
from mwms.v1 import agent_pb2 as pb

log = logging.getLogger("mwms.server.rpc")
HEARTBEAT_ACK = pb.CoordinatorMessage(ack=pb.Ack())


class AgentStream(MessageApplier):
    """The stream of the agent the call's credential proved (never the id an agent claims in a message):
    reads it, hands its messages to `MessageApplier` in order, and sends the hub's commands."""

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
                beat = message.heartbeat  # its warm pool is written with liveness, when it changed
                self.wiring.liveness.warm_pool(self.agent_id, beat.warm_pool_ready, beat.warm_pool_bytes)
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
