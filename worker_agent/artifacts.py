"""Packs a task's output directory into a tar.gz and uploads it to the coordinator in 1 MiB chunks."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

from mwms.v1 import agent_pb2, agent_pb2_grpc

CHUNK_BYTES = 1024 * 1024
UPLOAD_TIMEOUT_SECONDS = 1800.0


def directory_has_files(directory: Path) -> bool:
    """True when `directory` exists and holds anything."""
    return directory.is_dir() and any(directory.iterdir())


def pack_directory(directory: Path, archive: Path) -> None:
    """Writes `directory`'s contents to the tar.gz `archive`, with paths relative to `directory`."""
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(directory.iterdir()):
            tar.add(entry, arcname=entry.name)


def upload_archive(
    stub: agent_pb2_grpc.AgentServiceStub, task_id: str, kind: agent_pb2.FileKind.ValueType, archive: Path
) -> agent_pb2.UploadFilesResponse:
    """Streams `archive` with UploadFiles; the first chunk names the task and the kind of files."""
    response: agent_pb2.UploadFilesResponse = stub.UploadFiles(
        _chunks(task_id, kind, archive), timeout=UPLOAD_TIMEOUT_SECONDS
    )
    return response


def _chunks(task_id: str, kind: agent_pb2.FileKind.ValueType, archive: Path) -> Iterator[agent_pb2.FileChunk]:
    with archive.open("rb") as file:
        first = True
        while True:
            data = file.read(CHUNK_BYTES)
            if not data and not first:
                return
            if first:
                yield agent_pb2.FileChunk(task_id=task_id, kind=kind, data=data)
                first = False
            else:
                yield agent_pb2.FileChunk(data=data)
            if not data:
                return
