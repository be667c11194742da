"""One agent's Connect stream: a reader applying its messages and a dispatcher sending commands.

A message that cannot be applied never ends the stream (which would make the agent reconnect and resend
it forever): a log or metric batch is acknowledged with what was refused and why, so the agent drops it;
a task report is skipped. A start command that cannot be built or would not fit the agent's receive limit
fails its job with the reason. Each is logged and counted (server.poison). Only a refused credential and
database trouble end the stream.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import grpc

from mwms.v1 import agent_pb2 as pb
from server.errors import DomainError, Unauthenticated
from server.poison import contain, count_poison, is_transient
from server.rpc import convert
from server.rpc.status import grpc_status
from server.services import agent_messages
from server.services.agents import get_agent
from server.services.telemetry import StoreOutcome

if TYPE_CHECKING:
    from server.rpc.agent_service import AgentService

log = logging.getLogger("mwms.server.rpc")
HEARTBEAT_ACK = pb.CoordinatorMessage(ack=pb.Ack())
# gRPC's default max_receive_message_length, which the agents' channel keeps (worker_agent/channel.py).
AGENT_RECEIVE_LIMIT_BYTES = 4 * 1024 * 1024


class AgentStream:
    """The stream of the agent the call's credential proved (never the id an agent claims in a message)."""

    def __init__(self, service: AgentService, agent_id: str, context: grpc.aio.ServicerContext) -> None:
        self.service = service
        self.agent_id = agent_id
        self.context = context
        self.settings = service.settings
        self.sent_starts: set[str] = set()
        self.sent_stops: set[str] = set()
        self.write_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._close_reason = ""

    async def send(self, message: pb.CoordinatorMessage) -> None:
        async with self.write_lock:
            await self.context.write(message)

    def close(self, reason: str) -> None:
        """Ends the stream with UNAUTHENTICATED and `reason` (the agent may no longer talk); loop thread only."""
        self._close_reason = reason
        self._closed.set()

    async def run(self) -> None:
        hub = self.service.hub
        self.wake = hub.attach(self.agent_id, self)
        self.dispatcher: asyncio.Task[None] | None = None
        reader = asyncio.create_task(self._read())
        closing = asyncio.create_task(self._closed.wait())
        try:
            await asyncio.wait({reader, closing}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                reader.result()  # the agent ended the stream, or a message could not be applied
            else:
                log.warning("closing the stream of agent %s: %s", self.agent_id, self._close_reason)
                await self.context.abort(grpc.StatusCode.UNAUTHENTICATED, self._close_reason)
        except DomainError as error:
            await self.context.abort(grpc_status(error), str(error))
        finally:
            hub.detach(self.agent_id, self)
            for task in (reader, closing, self.dispatcher):
                if task is None:
                    continue
                task.cancel()  # a no-op for a finished task, whose outcome the await below collects
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the stream is over either way
                    pass

    async def _read(self) -> None:
        while True:
            message = await self.context.read()
            if message is grpc.aio.EOF:
                return
            if not self.service.hub.is_current(self.agent_id, self):
                log.warning("agent %s opened a newer stream; closing this one", self.agent_id)
                return
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
        write = self.service._write
        if body == "heartbeat":
            await write(agent_messages.accept_heartbeat, self.agent_id, timeout_s=settings.agent_timeout_s)
            await self.send(HEARTBEAT_ACK)  # lets the agent tell a live stream from a dead one
        elif body == "hello":
            if message.hello.agent_id and message.hello.agent_id != self.agent_id:
                log.warning(
                    "agent %s says hello as %r; its credential decides", self.agent_id, message.hello.agent_id
                )
            reports = [r for r in map(convert.task_report, message.hello.tasks) if r is not None]
            try:
                replies = await write(
                    agent_messages.accept_hello,
                    self.agent_id,
                    reports,
                    timeout_s=settings.agent_timeout_s,
                    backoff_base_s=settings.restart_backoff_s,
                )
            finally:
                # Commands flow once the agent said what it already runs, even after a hello that failed.
                self.sent_starts.clear()
                self.sent_stops.clear()
                if self.dispatcher is None:
                    self.dispatcher = asyncio.create_task(self._dispatch(self.wake))
            await self._reply(replies)
        elif body == "task":
            report = convert.task_report(message.task)
            if report is not None:
                replies = await write(
                    agent_messages.accept_report,
                    self.agent_id,
                    report,
                    backoff_base_s=settings.restart_backoff_s,
                )
                await self._reply(replies)
        elif body == "logs":
            stored = await write(
                agent_messages.accept_logs,
                self.agent_id,
                message.logs.task_id,
                convert.log_lines(message.logs),
                timeout_s=settings.agent_timeout_s,
            )
            await self.send(convert.ack(message.logs.task_id, log_seq=stored.acked_seq, stored=stored))
        elif body == "metrics":
            stored = await write(
                agent_messages.accept_metrics,
                self.agent_id,
                message.metrics.task_id,
                convert.metric_points(message.metrics),
                timeout_s=settings.agent_timeout_s,
            )
            await self.send(convert.ack(message.metrics.task_id, metric_seq=stored.acked_seq, stored=stored))
            if stored.changed:
                self.service.on_change()
                self.service.hub.wake()

    async def _refuse(self, message: pb.AgentMessage, body: str | None) -> None:
        """Contains a message that could not be applied: a batch is acknowledged as refused, so the agent
        drops it instead of resending it forever; a report or hello is skipped (logged and counted)."""
        what = f"a {body} message from agent {self.agent_id}"
        contain(log, f"agent_{body}", f"{self.agent_id}/{body}", what)
        reason = "the coordinator could not store this batch (an internal error, logged there)"
        if body == "logs":
            batch = message.logs
            refused = StoreOutcome(max((x.seq for x in batch.lines), default=0), len(batch.lines), reason)
            await self.send(convert.ack(batch.task_id, log_seq=refused.acked_seq, stored=refused))
        elif body == "metrics":
            points = message.metrics
            refused = StoreOutcome(max((x.seq for x in points.points), default=0), len(points.points), reason)
            await self.send(convert.ack(points.task_id, metric_seq=refused.acked_seq, stored=refused))

    async def _reply(self, replies: agent_messages.Replies) -> None:
        for task_id in replies.final_acks:
            await self.send(convert.ack(task_id, final_state=True))
        for task_id in replies.stop_ids:
            await self.send(convert.stop_unknown(task_id, self.settings.stop_grace_s))
        if replies.changed:
            self.service.on_change()
            self.service.hub.wake()

    async def _dispatch(self, wake: asyncio.Event) -> None:
        """Sends start and stop commands the database asks for; woken on changes, else every second.

        A failing pass (database trouble) is logged and retried: a dead dispatcher would leave a
        healthy-looking agent that never gets commands. Ends when a newer stream of the agent took over,
        and ends the stream when the agent was removed (a wake-up after the removal makes that immediate).
        """
        while self.service.hub.is_current(self.agent_id, self):
            wake.clear()  # before the pass, so a wake-up during it is not lost
            try:
                await self._send_pending()
            except asyncio.CancelledError:
                raise
            except grpc.RpcError:
                return  # the stream is gone; the reader ends the session
            except Unauthenticated as refusal:
                self.close(str(refusal))
                return
            except Exception:  # noqa: BLE001 - keep dispatching whatever one pass hit
                log.exception("dispatching commands to agent %s failed; retrying", self.agent_id)
            try:
                await asyncio.wait_for(wake.wait(), timeout=1.0)
            except TimeoutError:
                pass

    async def _send_pending(self) -> None:
        starts, stops = await asyncio.to_thread(self._pending)
        for task, job in starts:
            if task.id not in self.sent_starts:
                self.sent_starts.add(task.id)
                command = await self._start_command(task, job)
                if command is not None:
                    await self.send(command)
        for task in stops:
            if task.id not in self.sent_stops:
                self.sent_stops.add(task.id)
                await self.send(convert.stop_task(task, self.settings.stop_grace_s))

    async def _start_command(self, task: Any, job: Any) -> pb.CoordinatorMessage | None:
        """The StartTask for `task`, or None when its job's row cannot make one (the job is failed)."""
        try:
            command = convert.start_task(
                task, job, self.settings.stop_grace_s, self.settings.shared_checkpoint_dir
            )
        except Exception as error:  # noqa: BLE001 - a damaged job row must not stop this agent's commands
            contain(log, "start_task", task.id, f"the start command of task {task.id} (job {job.id})")
            reason = f"its start command cannot be built ({type(error).__name__}: {str(error)[:200]})"
        else:
            size = command.ByteSize()
            if size <= AGENT_RECEIVE_LIMIT_BYTES:
                return command
            count_poison("start_task")
            reason = (
                f"its start command is {size} bytes, over the agents' receive limit of "
                f"{AGENT_RECEIVE_LIMIT_BYTES} bytes: make env and command smaller"
            )
            log.warning("task %s of job %s: %s", task.id, job.id, reason)
        if await self.service._write(agent_messages.refuse_start, task.id, reason):
            self.service.on_change()
            self.service.hub.wake()
        return None

    def _pending(self) -> tuple[list[Any], list[Any]]:
        with self.service.db.read() as session:
            get_agent(session, self.agent_id)  # Unauthenticated once an admin removed the agent
            return agent_messages.pending_commands(session, self.agent_id)
