"""UploadFiles on a real coordinator (its own gRPC server on loopback): the size cap, archive bombs in
artifacts and checkpoints refused with nothing left behind, and files hashed in chunks, not in memory."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from mwms.server.db.models import StoredFile
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.bombs import GIB, MIB, PIECE, gzip_bomb, tar_header
from mwms_testkit.coordinator_rows import place_task, register_request
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

JOIN_TOKEN = "join-token-for-upload-limit-tests-0123456789"
ADMIN_TOKEN = "mwms_admin-token-for-upload-limit-tests-01"


@dataclass
class Coordinator(InProcessCoordinator):
    """An agent registered, with one task RUNNING on it, that uploads files."""

    def __post_init__(self) -> None:
        registered = self.stub.Register(register_request("uploader", JOIN_TOKEN), timeout=10)
        self.metadata = (("authorization", f"Bearer {registered.credential}"),)
        task = place_task(self.db, registered.agent_id, digest="d" * 64)
        self.task_id, self.job_id = task.id, task.job_id

    def upload(self, kind: pb.FileKind.ValueType, archive: Path) -> pb.UploadFilesResponse:
        def chunks() -> Iterator[pb.FileChunk]:
            with archive.open("rb") as file:
                yield pb.FileChunk(task_id=self.task_id, kind=kind, data=file.read(MIB))
                while data := file.read(MIB):
                    yield pb.FileChunk(data=data)

        return self.stub.UploadFiles(chunks(), metadata=self.metadata, timeout=60)

    def stored(self) -> list[tuple[str, str, int, str]]:
        with self.db.read() as session:
            rows = session.scalars(select(StoredFile).where(StoredFile.job_id == self.job_id)).all()
            return sorted((r.kind, r.path, r.size, r.sha256) for r in rows)

    def files_left(self) -> list[str]:
        root = self.settings.files_dir
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    with ExitStack() as stack:

        def started(**limits: object) -> Coordinator:
            settings = coordinator_settings(
                tmp_path / "coordinator",
                join_token=JOIN_TOKEN,
                admin_token=ADMIN_TOKEN,
                agent_timeout_s=300,
                **limits,
            )
            return Coordinator.start(stack, settings)

        yield started


def refused(call, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == code, caught.value
    return caught.value.details()


def test_an_upload_over_the_cap_is_refused_and_leaves_nothing(start, tmp_path: Path) -> None:
    coordinator = start(max_upload_bytes=2 * MIB)
    archive = tmp_path / "big.tar.gz"
    archive.write_bytes(b"\x1f\x8b" + bytes(5 * MIB))
    for kind in (pb.FILE_KIND_ARTIFACTS, pb.FILE_KIND_CHECKPOINT):
        detail = refused(
            lambda kind=kind: coordinator.upload(kind, archive), grpc.StatusCode.RESOURCE_EXHAUSTED
        )
        assert "MWMS_MAX_UPLOAD_BYTES" in detail and "2097152 bytes" in detail
    assert coordinator.stored() == [] and coordinator.files_left() == []


def test_bombs_in_artifacts_and_checkpoints_are_refused_and_leave_nothing(start, tmp_path: Path) -> None:
    coordinator = start()
    bomb = gzip_bomb(tmp_path / "bomb.tar.gz", 4 * GIB)
    for kind in (pb.FILE_KIND_ARTIFACTS, pb.FILE_KIND_CHECKPOINT):
        detail = refused(lambda kind=kind: coordinator.upload(kind, bomb))
        assert "was refused" in detail and "MWMS_ARCHIVE_MAX_RATIO" in detail, detail
    assert coordinator.stored() == [] and coordinator.files_left() == []


def test_large_files_are_hashed_in_chunks(start, tmp_path: Path) -> None:
    """A 512 MiB artifact (from a 512 KiB archive: the ratio limit raised) must not add 512 MiB of memory."""
    coordinator = start(archive_max_ratio=1e6)
    archive = gzip_bomb(tmp_path / "artifacts.tar.gz", 512 * MIB, piece=512 * MIB)
    checkpoint = tmp_path / "checkpoint.tar.gz"
    checkpoint.write_bytes(gzip.compress(tar_header("ckpt.index", 10) + b"0123456789" + bytes(502 + 1024)))
    status = Path("/proc/self/status")
    Path("/proc/self/clear_refs").write_text("5")
    before = _kib(status, "VmRSS")
    response = coordinator.upload(pb.FILE_KIND_ARTIFACTS, archive)
    peak = _kib(status, "VmHWM")
    assert response.size == archive.stat().st_size
    zeros = hashlib.sha256()
    for _ in range(512 * MIB // PIECE):
        zeros.update(bytes(PIECE))
    assert coordinator.stored() == [("artifact", "zeros.bin", 512 * MIB, zeros.hexdigest())]
    assert peak - before < 100 * 1024, f"RSS {before} KiB before, peak {peak} KiB"
    response = coordinator.upload(pb.FILE_KIND_CHECKPOINT, checkpoint)
    assert response.sha256 == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert (
        "checkpoint",
        "checkpoint.tar.gz",
        checkpoint.stat().st_size,
        response.sha256,
    ) in coordinator.stored()
    assert not [name for name in coordinator.files_left() if name.endswith((".upload", ".partial"))]


def _kib(status: Path, field: str) -> int:
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in {status}")
