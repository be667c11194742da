"""The gRPC AgentService: registration, the per-agent Connect stream, bundle and file transfers.

Who is calling comes from the interceptor (server/rpc/auth.py), which also turns domain errors raised
here into statuses; what the caller may do is decided in server/services/agent_auth.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from mwms.archive import ArchiveWorkers, archive_workers
from mwms.v1 import agent_pb2 as pb
from mwms.v1 import agent_pb2_grpc
from server.errors import InvalidInput
from server.live.wiring import Wiring
from server.rpc import convert
from server.rpc.agent_stream import AgentStream
from server.rpc.auth import authenticated_agent_id, presented_credential
from server.services import agent_auth, files
from server.services.bundles import CHUNK
from server.services.uploads import UploadSpool

log = logging.getLogger("mwms.server.rpc")
T = TypeVar("T")
UPLOAD_KINDS = (pb.FILE_KIND_ARTIFACTS, pb.FILE_KIND_CHECKPOINT)


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

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        def run() -> T:
            with self.db.read() as session:
                return fn(session, *args)

        return await asyncio.to_thread(run)

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        agent, credential = await self._write(
            agent_auth.admit_agent,
            convert.registration(request),
            credential=presented_credential(context.invocation_metadata()),
            join_token=request.join_token,
            bootstrap_join_token=self.settings.join_token.get_secret_value(),
            timeout_s=self.settings.agent_timeout_s,
            connected=frozenset(self.wiring.hub.connected()),
        )
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

    async def FetchBundle(
        self, request: pb.FetchBundleRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BundleChunk]:
        path = await self._read(
            agent_auth.bundle_for_agent, self.settings.bundle_dir, authenticated_agent_id(), request.digest
        )
        async for chunk in _file_chunks(path):
            yield pb.BundleChunk(data=chunk)

    async def FetchCheckpoint(
        self, request: pb.FetchCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BundleChunk]:
        path = await self._read(
            agent_auth.checkpoint_for_agent, self.settings.files_dir, authenticated_agent_id(), request.job_id
        )
        if path is None:
            return
        async for chunk in _file_chunks(path):
            yield pb.BundleChunk(data=chunk)

    async def UploadFiles(
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> pb.UploadFilesResponse:
        agent_id = authenticated_agent_id()
        chunks = aiter(request_iterator)
        first = await anext(chunks, None)
        if first is None or not first.task_id or first.kind not in UPLOAD_KINDS:
            raise InvalidInput("the first chunk of an upload must name the task and the file kind")
        checkpoint = first.kind == pb.FILE_KIND_CHECKPOINT
        # Checked before any data is stored: nobody fills the coordinator's disk on another agent's behalf.
        task = await self._read(agent_auth.task_for_upload, agent_id, first.task_id, checkpoint)
        # Writing and checking run in the archive pool: an upload never holds the threads heartbeats need.
        workers = archive_workers(self.settings.archive_workers)
        limits = self.settings.archive_limits
        spool = await workers.run(UploadSpool, self.settings.files_dir, self.settings.max_upload_bytes)
        try:
            await self._receive(first, chunks, spool, workers)
            path, digest, size = spool.finish()
            if not checkpoint:
                found = await workers.run(files.unpack_artifacts, self.settings.files_dir, task, path, limits)
                await self._write(files.record_artifacts, task, found)
                return pb.UploadFilesResponse(size=size)
            await workers.run(files.check_checkpoint, path, task, limits)
            # An attempt may have started during the upload: an older checkpoint must not replace its own.
            await self._read(agent_auth.task_for_upload, agent_id, task.id, True)
            await workers.run(files.install_checkpoint, self.settings.files_dir, task, path)
            await self._write(files.record_checkpoint, task, size, digest)
            return pb.UploadFilesResponse(size=size, sha256=digest)
        finally:
            spool.discard()  # nothing left when refused; a no-op once the file was moved into place

    async def _receive(
        self,
        first: pb.FileChunk,
        chunks: AsyncIterator[pb.FileChunk],
        spool: UploadSpool,
        workers: ArchiveWorkers,
    ) -> None:
        """Writes the upload's data to `spool`, which refuses it past the upload limit before reading on.
        Refuses a second task or kind."""
        chunk: pb.FileChunk | None = first
        while chunk is not None:
            if (
                chunk is not first
                and chunk.task_id
                and (chunk.task_id, chunk.kind) != (first.task_id, first.kind)
            ):
                raise InvalidInput(
                    "an upload carries the files of one task: name the task in the first chunk only"
                )
            await workers.run(spool.write, chunk.data)
            chunk = await anext(chunks, None)


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as f:
        while chunk := await asyncio.to_thread(f.read, CHUNK):
            yield chunk
