"""The gRPC AgentService: registration, the per-agent Connect stream, bundle and file transfers.

Who is calling comes from the interceptor (server/rpc/auth.py), which also turns domain errors raised
here into statuses; what the caller may do is decided in server/services/fleet/agent_auth.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from mwms.archive import archive_workers
from mwms.server.live.wiring import Wiring
from mwms.server.rpc import convert
from mwms.server.rpc.agent_stream import AgentStream
from mwms.server.rpc.auth import authenticated_agent_id, presented_credential
from mwms.server.services.fleet import agent_auth, agent_uploads, replicas
from mwms.server.services.storage.bundles import CHUNK
from mwms.v1 import agent_pb2 as pb
from mwms.v1 import agent_pb2_grpc

log = logging.getLogger("mwms.server.rpc")
T = TypeVar("T")


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring  # what the Connect streams use: hub, liveness, writers, stack collector
        self.db = wiring.db
        self.settings = wiring.settings

    async def _write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def run() -> T:
            with self.db.write() as session:
                return fn(session, *args, **kwargs)

        return await asyncio.to_thread(run)

    async def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def run() -> T:
            with self.db.read() as session:
                return fn(session, *args, **kwargs)

        return await asyncio.to_thread(run)

    def _admit(self, session: Any, reg: Any, *, held: frozenset[str], **kwargs: Any) -> Any:
        # A name whose agent holds a stream here or on another live replica is taken.
        connected = held | replicas.name_streaming_elsewhere(session, self.wiring.replica.id, reg.name)
        return agent_auth.admit_agent(session, reg, connected=connected, **kwargs)

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        registration = convert.registration(request)
        presented = presented_credential(context.invocation_metadata())
        known = await self._read(agent_auth.known_registration, registration, presented)
        if known is not None:  # a reconnect: nothing changed, nothing to write
            return self._registered(known, "")
        agent, credential = await self._write(
            self._admit,
            registration,
            credential=presented,
            join_token=request.join_token,
            bootstrap_join_token=self.settings.join_token.get_secret_value(),
            timeout_s=self.settings.agent_timeout_s,
            held=frozenset(self.wiring.hub.connected()),
        )
        return self._registered(agent, credential)

    def _registered(self, agent: Any, credential: str) -> pb.RegisterResponse:
        log.info(
            "agent %s %s (%s, %d devices)",
            agent.name,
            "joined" if credential else "registered again",
            agent.advertise_address,
            len(agent.devices),
        )
        self.wiring.poke_scheduler()
        return pb.RegisterResponse(
            agent_id=agent.id,
            heartbeat_interval_ms=int(self.settings.heartbeat_interval_s * 1000),
            credential=credential,
        )

    # Reads and writes through context.read()/write() instead of returning an iterator (grpc.aio allows both).
    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        await AgentStream(self.wiring, authenticated_agent_id(), context).run()

    async def _read_file_lookup(self, fn: Callable[..., T], *args: Any) -> T:
        """A read that may copy a file out of the database first (another replica received it): it runs in
        the archive threads, never in the ones that the streams' database work (hellos, reports) needs."""

        def run() -> T:
            with self.db.read() as session:
                return fn(session, *args)

        return await archive_workers(self.settings.archive_workers).run(run)

    async def FetchBundle(
        self, request: pb.FetchBundleRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BundleChunk]:
        path = await self._read_file_lookup(
            agent_auth.bundle_for_agent, self.settings.bundle_dir, authenticated_agent_id(), request.digest
        )
        async for chunk in _file_chunks(path):
            yield pb.BundleChunk(data=chunk)

    async def FetchCheckpoint(
        self, request: pb.FetchCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BundleChunk]:
        path = await self._read_file_lookup(
            agent_auth.checkpoint_for_agent, self.settings.files_dir, authenticated_agent_id(), request.job_id
        )
        if path is None:
            return
        async for chunk in _file_chunks(path):
            yield pb.BundleChunk(data=chunk)

    async def UploadFiles(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> pb.UploadFilesResponse:
        settings = self.settings
        stored = await agent_uploads.receive_task_files(
            authenticated_agent_id(),
            convert.upload_chunks(aiter(request_iterator)),
            agent_uploads.UploadPlaces(
                settings.files_dir, settings.max_upload_bytes, settings.archive_limits
            ),
            read=self._read,
            write=self._write,
            workers=archive_workers(settings.archive_workers),
        )
        return convert.upload_response(stored)


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk
