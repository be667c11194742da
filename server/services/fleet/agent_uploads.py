"""An agent's upload of one task's files (UploadFiles): the rules from the first chunk to the stored file.

The first chunk names the task and the kind; the task must be the agent's own (checked before any data is
stored, so nobody fills the coordinator's disk on another agent's behalf); the data is spooled within the
upload limit; an upload carries one task's files. Artifacts are unpacked, shared and recorded; a
checkpoint is checked, and shared and installed only if no newer attempt started during the upload
(shared: stored in the database too, for the other replicas, server/services/storage/shared_files.py).

Transport-free: the servicer hands in plain chunks, its transaction runners and the archive pool, in which
all writing and checking run (an upload never holds the threads heartbeats need).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from mwms.archive import ArchiveLimits, ArchiveWorkers
from mwms.server.errors import InvalidInput
from mwms.server.services.fleet import agent_auth
from mwms.server.services.storage import files, shared_files
from mwms.server.services.storage.uploads import UploadSpool

T = TypeVar("T")
FileKind = Literal["artifacts", "checkpoint"]
UPLOAD_KINDS: tuple[FileKind, ...] = ("artifacts", "checkpoint")


class Transaction(Protocol):
    """Runs `fn(session, *args, **kwargs)` in a transaction of its own, off the event loop."""

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]: ...


@dataclass(frozen=True)
class UploadChunk:
    """One FileChunk as the agent sent it; `kind` is "artifacts", "checkpoint", or another value (one per
    kind) for a kind this coordinator does not take."""

    task_id: str
    kind: str
    data: bytes


@dataclass(frozen=True)
class StoredUpload:
    """What was stored: its size, and for a checkpoint its sha256 (empty for artifacts)."""

    size: int
    sha256: str = ""


@dataclass(frozen=True)
class UploadPlaces:
    """Where uploads go and the limits they are held to."""

    files_dir: Path
    max_upload_bytes: int
    archive_limits: ArchiveLimits


async def receive_task_files(
    agent_id: str,
    chunks: AsyncIterator[UploadChunk],
    places: UploadPlaces,
    *,
    read: Transaction,
    write: Transaction,
    workers: ArchiveWorkers,
) -> StoredUpload:
    """Stores one upload of the agent's task's artifacts or checkpoint; refused with a domain error
    (InvalidInput, NotFound, Forbidden, UploadTooLarge, Conflict) and nothing left behind otherwise."""
    first = await anext(chunks, None)
    if first is None or not first.task_id or first.kind not in UPLOAD_KINDS:
        raise InvalidInput("the first chunk of an upload must name the task and the file kind")
    checkpoint = first.kind == "checkpoint"
    task = await read(agent_auth.task_for_upload, agent_id, first.task_id, checkpoint)
    spool = await workers.run(UploadSpool, places.files_dir, places.max_upload_bytes)
    try:
        await _spool_chunks(first, chunks, spool, workers)
        path, digest, size = spool.finish()
        limits = places.archive_limits
        # Copies into the database run here, in the pool and outside any transaction (shared_files.py).
        engine = await read(shared_files.engine_of)
        if not checkpoint:
            found = await workers.run(files.unpack_artifacts, places.files_dir, task, path, limits)
            await workers.run(files.share_artifacts, engine, places.files_dir, task, found)
            await write(files.record_artifacts, task, found)
            return StoredUpload(size=size)
        await workers.run(files.check_checkpoint, path, task, limits)
        # An attempt may have started during the upload: an older checkpoint must not replace its own.
        await read(agent_auth.task_for_upload, agent_id, task.id, True)
        await workers.run(files.share_checkpoint, engine, places.files_dir, task, path, digest)
        await workers.run(files.install_checkpoint, places.files_dir, task, path)
        await write(files.record_checkpoint, task, size, digest)
        return StoredUpload(size=size, sha256=digest)
    finally:
        spool.discard()  # nothing left when refused; a no-op once the file was moved into place


async def _spool_chunks(
    first: UploadChunk, chunks: AsyncIterator[UploadChunk], spool: UploadSpool, workers: ArchiveWorkers
) -> None:
    """Writes the upload's data to `spool`, which refuses it past the upload limit before reading on.
    Refuses a second task or kind."""
    chunk: UploadChunk | None = first
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
