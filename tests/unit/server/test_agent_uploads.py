"""The upload rules of UploadFiles on their own (server/services/fleet/agent_uploads.py), on a real database and
files directory: what the first chunk must say, whose task it is, one task per upload, the size limit,
artifacts unpacked and recorded, and a checkpoint that a newer attempt overtook during its upload refused."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import select

from mwms.archive import ArchiveWorkers
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Attempt, StoredFile
from mwms.server.errors import Conflict, Forbidden, InvalidInput, UploadTooLarge
from mwms.server.services.fleet.agent_uploads import (
    StoredUpload,
    UploadChunk,
    UploadPlaces,
    receive_task_files,
)
from mwms.server.settings import Settings
from mwms_testkit.coordinator_rows import place_task, seeded_database

T = TypeVar("T")
DIGEST = "f" * 64


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = seeded_database(tmp_path / "uploads.db", DIGEST, ["owner", "stranger"])
    yield database
    database.dispose()


def agent_id(db: Database, name: str) -> str:
    with db.read() as session:
        return session.scalars(select(Agent.id).where(Agent.name == name)).one()


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload(
    db: Database,
    files_dir: Path,
    agent: str,
    chunks: Iterable[UploadChunk | Callable[[], None]],
    max_bytes: int = 1 << 20,
) -> StoredUpload:
    """Runs the service as the servicer does; a callable among `chunks` runs when the upload reaches it."""

    async def read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with db.read() as session:
            return fn(session, *args, **kwargs)

    async def write(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with db.write() as session:
            return fn(session, *args, **kwargs)

    async def arriving() -> AsyncIterator[UploadChunk]:
        for item in chunks:
            if isinstance(item, UploadChunk):
                yield item
            else:
                item()

    limits = Settings(data_dir=files_dir.parent, max_upload_bytes=max_bytes).archive_limits
    places = UploadPlaces(files_dir, max_bytes, limits)
    workers = ArchiveWorkers(2)
    return asyncio.run(receive_task_files(agent, arriving(), places, read=read, write=write, workers=workers))


def stored(db: Database) -> list[tuple[str, str, int]]:
    with db.read() as session:
        return sorted((r.kind, r.path, r.size) for r in session.scalars(select(StoredFile)))


def left(files_dir: Path) -> list[str]:
    return sorted(p.name for p in files_dir.rglob("*") if p.is_file()) if files_dir.exists() else []


@pytest.mark.parametrize(
    "first",
    [UploadChunk("", "artifacts", b"x"), UploadChunk("t", "", b"x"), UploadChunk("t", "0", b"x")],
    ids=["no-task", "no-kind", "unknown-kind"],
)
def test_the_first_chunk_must_name_the_task_and_a_known_kind(db, tmp_path, first):
    with pytest.raises(InvalidInput, match="first chunk of an upload must name the task and the file kind"):
        upload(db, tmp_path / "files", agent_id(db, "owner"), [first])
    with pytest.raises(InvalidInput):
        upload(db, tmp_path / "files", agent_id(db, "owner"), [])
    assert left(tmp_path / "files") == []


def test_another_agents_task_is_refused_before_any_data_is_stored(db, tmp_path):
    task = place_task(db, agent_id(db, "owner"), digest=DIGEST)
    files_dir = tmp_path / "files"
    with pytest.raises(Forbidden, match="only for its own tasks"):
        upload(db, files_dir, agent_id(db, "stranger"), [UploadChunk(task.id, "artifacts", b"x")])
    assert not files_dir.exists() and stored(db) == []


def test_an_upload_carries_one_task_and_is_held_to_the_limit(db, tmp_path):
    owner = agent_id(db, "owner")
    task = place_task(db, owner, digest=DIGEST)
    other = place_task(db, owner, digest=DIGEST, port=20001)
    files_dir = tmp_path / "files"
    second_task = [UploadChunk(task.id, "artifacts", b"a"), UploadChunk(other.id, "artifacts", b"b")]
    with pytest.raises(InvalidInput, match="one task"):
        upload(db, files_dir, owner, second_task)
    second_kind = [UploadChunk(task.id, "artifacts", b"a"), UploadChunk(task.id, "checkpoint", b"b")]
    with pytest.raises(InvalidInput, match="one task"):
        upload(db, files_dir, owner, second_kind)
    too_big = [UploadChunk(task.id, "artifacts", b"a" * 60), UploadChunk("", "", b"b" * 60)]
    with pytest.raises(UploadTooLarge, match="limit of 100 bytes"):
        upload(db, files_dir, owner, too_big, max_bytes=100)
    assert left(files_dir) == [] and stored(db) == []


def test_artifacts_are_unpacked_and_recorded(db, tmp_path):
    owner = agent_id(db, "owner")
    task = place_task(db, owner, digest=DIGEST)
    archive = tar_gz({"model/weights.bin": b"w" * 10, "log.txt": b"done"})
    half = len(archive) // 2
    chunks = [UploadChunk(task.id, "artifacts", archive[:half]), UploadChunk("", "", archive[half:])]
    result = upload(db, tmp_path / "files", owner, chunks)
    assert result == StoredUpload(size=len(archive), sha256="")
    assert stored(db) == [("artifact", "log.txt", 4), ("artifact", "model/weights.bin", 10)]


def test_a_checkpoint_overtaken_by_a_newer_attempt_during_its_upload_is_not_installed(db, tmp_path):
    owner = agent_id(db, "owner")
    task = place_task(db, owner, digest=DIGEST)
    files_dir = tmp_path / "files"

    def newer_attempt_starts() -> None:
        with db.write() as session:
            session.add(Attempt(job_id=task.job_id, number=2, state="ACTIVE"))

    archive = tar_gz({"ckpt/index": b"i"})
    chunks = [UploadChunk(task.id, "checkpoint", archive), newer_attempt_starts]
    with pytest.raises(Conflict, match="attempt 2 is newer"):
        upload(db, files_dir, owner, chunks)
    assert left(files_dir) == [] and stored(db) == []


def test_a_current_checkpoint_is_installed_with_its_digest(db, tmp_path):
    owner = agent_id(db, "owner")
    task = place_task(db, owner, digest=DIGEST)
    archive = tar_gz({"ckpt/index": b"i"})
    result = upload(db, tmp_path / "files", owner, [UploadChunk(task.id, "checkpoint", archive)])
    assert result.size == len(archive) and len(result.sha256) == 64
    assert stored(db) == [("checkpoint", "checkpoint.tar.gz", len(archive))]
    assert left(tmp_path / "files") == ["checkpoint.tar.gz"]
