"""The gRPC AgentService: registration, the per-agent session stream, bundle and file transfers."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from mwms.v1 import agent_pb2 as pb
from mwms.v1 import agent_pb2_grpc
from server.db.engine import Database
from server.db.models import Task
from server.errors import DomainError, InvalidInput, NameTaken, NotFound, Unauthenticated
from server.rpc import convert
from server.rpc.hub import AgentHub
from server.services import agent_messages, files
from server.services.agents import register_agent
from server.services.bundles import CHUNK, bundle_path
from server.settings import Settings

log = logging.getLogger("mwms.server.rpc")
HEARTBEAT_ACK = pb.CoordinatorMessage(ack=pb.Ack())
T = TypeVar("T")

_STATUS = {
    NameTaken: grpc.StatusCode.ALREADY_EXISTS,
    NotFound: grpc.StatusCode.NOT_FOUND,
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}


def grpc_status(error: DomainError) -> grpc.StatusCode:
    """The one mapping from domain errors to gRPC status codes."""
    for kind, code in _STATUS.items():
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.FAILED_PRECONDITION


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self, db: Database, settings: Settings, hub: AgentHub, on_change: Callable[[], None]
    ) -> None:
        self.db = db
        self.settings = settings
        self.hub = hub
        self.on_change = on_change  # wakes the scheduler when task states changed

    async def _write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def run() -> T:
            with self.db.write() as session:
                return fn(session, *args, **kwargs)

        return await asyncio.to_thread(run)

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        if self.settings.join_token and request.join_token != self.settings.join_token:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "wrong or missing join token: start the agent with the coordinator's --join-token",
            )
        try:
            agent = await self._write(
                register_agent,
                convert.registration(request),
                self.settings.agent_timeout_s,
                connected=frozenset(self.hub.connected()),
            )
        except DomainError as error:
            await context.abort(grpc_status(error), str(error))
        log.info(
            "agent %s registered (%s, %d devices)", agent.name, agent.advertise_address, len(agent.devices)
        )
        self.on_change()
        return pb.RegisterResponse(
            agent_id=agent.id, heartbeat_interval_ms=int(self.settings.heartbeat_interval_s * 1000)
        )

    # Reads and writes through context.read()/write() instead of returning an iterator (grpc.aio allows both).
    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        agent_id = dict(context.invocation_metadata() or ()).get("agent-id", "")
        if not agent_id:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "missing agent-id metadata: call Register first"
            )
        session = AgentStream(self, agent_id, context)
        await session.run()

    async def FetchBundle(
        self, request: pb.FetchBundleRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BundleChunk]:
        def locate(session: Any) -> Path:
            return bundle_path(session, self.settings.bundle_dir, request.digest)

        try:
            path = await asyncio.to_thread(self._read, locate)
        except DomainError as error:
            await context.abort(grpc_status(error), str(error))
        async for chunk in _file_chunks(path):
            yield pb.BundleChunk(data=chunk)

    async def FetchCheckpoint(
        self, request: pb.FetchCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BundleChunk]:
        path = files.checkpoint_archive(self.settings.files_dir, request.job_id)
        if not path.exists():
            return
        async for chunk in _file_chunks(path):
            yield pb.BundleChunk(data=chunk)

    async def UploadFiles(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> pb.UploadFilesResponse:
        self.settings.files_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.settings.files_dir, suffix=".upload")
        path = Path(name)
        task_id, kind, size = "", pb.FILE_KIND_UNSPECIFIED, 0
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in request_iterator:
                    if chunk.task_id:
                        task_id, kind = chunk.task_id, chunk.kind
                    size += len(chunk.data)
                    await asyncio.to_thread(out.write, chunk.data)
            task = await asyncio.to_thread(self._read, lambda s: s.get(Task, task_id))
            if task is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no task {task_id!r} to attach files to")
            if kind == pb.FILE_KIND_ARTIFACTS:
                found = await asyncio.to_thread(files.unpack_artifacts, self.settings.files_dir, task, path)
                await self._write(files.record_artifacts, task, found)
                return pb.UploadFilesResponse(size=size)
            if kind == pb.FILE_KIND_CHECKPOINT:
                await asyncio.to_thread(self._read, lambda s: files.ensure_current_attempt(s, task))
                size, digest = await asyncio.to_thread(
                    files.install_checkpoint, self.settings.files_dir, task, path
                )
                await self._write(files.record_checkpoint, task, size, digest)
                return pb.UploadFilesResponse(size=size, sha256=digest)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first chunk must name the file kind")
        except DomainError as error:
            await context.abort(grpc_status(error), str(error))
        except ValueError as error:  # unsafe archive entries
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        finally:
            path.unlink(missing_ok=True)
        raise AssertionError("unreachable")

    def _read(self, fn: Callable[[Any], T]) -> T:
        with self.db.read() as session:
            return fn(session)


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk


class AgentStream:
    """One agent's Connect stream: a reader applying its messages and a dispatcher sending commands."""

    def __init__(self, service: AgentService, agent_id: str, context: grpc.aio.ServicerContext) -> None:
        self.service = service
        self.agent_id = agent_id
        self.context = context
        self.settings = service.settings
        self.sent_starts: set[str] = set()
        self.sent_stops: set[str] = set()
        self.write_lock = asyncio.Lock()

    async def send(self, message: pb.CoordinatorMessage) -> None:
        async with self.write_lock:
            await self.context.write(message)

    async def run(self) -> None:
        hub = self.service.hub
        self.wake = hub.attach(self.agent_id, self)
        self.dispatcher: asyncio.Task[None] | None = None
        try:
            await self._read()
        except DomainError as error:
            await self.context.abort(grpc_status(error), str(error))
        finally:
            hub.detach(self.agent_id, self)
            if self.dispatcher is not None:
                self.dispatcher.cancel()
                try:
                    await self.dispatcher
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the stream is over either way
                    pass

    async def _read(self) -> None:
        settings = self.settings
        while True:
            message = await self.context.read()
            if message is grpc.aio.EOF:
                return
            if not self.service.hub.is_current(self.agent_id, self):
                log.warning("agent %s opened a newer stream; closing this one", self.agent_id)
                return
            body = message.WhichOneof("body")
            if body == "heartbeat":
                await self.service._write(
                    agent_messages.accept_heartbeat, self.agent_id, timeout_s=settings.agent_timeout_s
                )
                await self.send(HEARTBEAT_ACK)  # lets the agent tell a live stream from a dead one
            elif body == "hello":
                reports = [r for r in map(convert.task_report, message.hello.tasks) if r is not None]
                replies = await self.service._write(
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
                    replies = await self.service._write(
                        agent_messages.accept_report,
                        self.agent_id,
                        report,
                        backoff_base_s=settings.restart_backoff_s,
                    )
                    await self._reply(replies)
            elif body == "logs":
                seq = await self.service._write(
                    agent_messages.accept_logs,
                    self.agent_id,
                    message.logs.task_id,
                    convert.log_lines(message.logs),
                    timeout_s=settings.agent_timeout_s,
                )
                await self.send(convert.ack(message.logs.task_id, log_seq=seq))
            elif body == "metrics":
                seq = await self.service._write(
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
        healthy-looking agent that never gets commands. Ends when a newer stream of the agent took over.
        """
        while self.service.hub.is_current(self.agent_id, self):
            wake.clear()  # before the pass, so a wake-up during it is not lost
            try:
                await self._send_pending()
            except asyncio.CancelledError:
                raise
            except grpc.RpcError:
                return  # the stream is gone; the reader ends the session
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

    def _pending(self) -> tuple[list, list]:
        with self.service.db.read() as session:
            return agent_messages.pending_commands(session, self.agent_id)
