"""One agent's Connect stream: a reader applying its messages and a dispatcher sending commands."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import grpc

from mwms.v1 import agent_pb2 as pb
from server.errors import DomainError, Unauthenticated
from server.rpc import convert
from server.rpc.status import grpc_status
from server.services import agent_messages
from server.services.agents import get_agent

if TYPE_CHECKING:
    from server.rpc.agent_service import AgentService

log = logging.getLogger("mwms.server.rpc")
HEARTBEAT_ACK = pb.CoordinatorMessage(ack=pb.Ack())


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
        settings = self.settings
        write = self.service._write
        while True:
            message = await self.context.read()
            if message is grpc.aio.EOF:
                return
            if not self.service.hub.is_current(self.agent_id, self):
                log.warning("agent %s opened a newer stream; closing this one", self.agent_id)
                return
            body = message.WhichOneof("body")
            if body == "heartbeat":
                await write(
                    agent_messages.accept_heartbeat, self.agent_id, timeout_s=settings.agent_timeout_s
                )
                await self.send(HEARTBEAT_ACK)  # lets the agent tell a live stream from a dead one
            elif body == "hello":
                if message.hello.agent_id and message.hello.agent_id != self.agent_id:
                    log.warning(
                        "agent %s says hello as %r; its credential decides",
                        self.agent_id,
                        message.hello.agent_id,
                    )
                reports = [r for r in map(convert.task_report, message.hello.tasks) if r is not None]
                replies = await write(
                    agent_messages.accept_hello,
                    self.agent_id,
                    reports,
                    timeout_s=settings.agent_timeout_s,
                    backoff_base_s=settings.restart_backoff_s,
                )
                self.sent_starts.clear()
                self.sent_stops.clear()
                await self._reply(replies)
                if self.dispatcher is None:  # commands only once the agent said what it already runs
                    self.dispatcher = asyncio.create_task(self._dispatch(self.wake))
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
                seq = await write(
                    agent_messages.accept_logs,
                    self.agent_id,
                    message.logs.task_id,
                    convert.log_lines(message.logs),
                    timeout_s=settings.agent_timeout_s,
                )
                await self.send(convert.ack(message.logs.task_id, log_seq=seq))
            elif body == "metrics":
                seq = await write(
                    agent_messages.accept_metrics,
                    self.agent_id,
                    message.metrics.task_id,
                    convert.metric_points(message.metrics),
                    timeout_s=settings.agent_timeout_s,
                )
                await self.send(convert.ack(message.metrics.task_id, metric_seq=seq))

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
                await self.send(
                    convert.start_task(
                        task, job, self.settings.stop_grace_s, self.settings.shared_checkpoint_dir
                    )
                )
        for task in stops:
            if task.id not in self.sent_stops:
                self.sent_stops.add(task.id)
                await self.send(convert.stop_task(task, self.settings.stop_grace_s))

    def _pending(self) -> tuple[list[Any], list[Any]]:
        with self.service.db.read() as session:
            get_agent(session, self.agent_id)  # Unauthenticated once an admin removed the agent
            return agent_messages.pending_commands(session, self.agent_id)
