"""Files shared through the database (server/services/storage/shared_files.py): two data dirs, two "replicas", on
one real PostgreSQL database; and the no-ops on SQLite."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Bundle, SharedFile, SharedFileChunk, Task
from mwms.server.errors import NotFound
from mwms.server.services.storage import bundles, files, shared_files
from mwms.server.services.storage.shared_files import CHUNK_BYTES, SharedFileDamaged

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def pg(postgres) -> Iterator[Database]:
    """One migrated PostgreSQL database for the module, on the session's server; each test uses paths of
    its own."""
    db = Database(postgres.create_database("shared_files"))
    upgrade_to_head(db.engine)
    try:
        yield db
    finally:
        db.dispose()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """The data dirs of replica A and replica B."""
    a, b = tmp_path / "replica-a", tmp_path / "replica-b"
    a.mkdir()
    b.mkdir()
    return a, b


def write(data_dir: Path, path: str, data: bytes) -> Path:
    file = data_dir / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(data)
    return file


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(f"*{shared_files.TEMP_SUFFIX}"))


def shared_row(db: Database, path: str) -> SharedFile | None:
    with db.read() as session:
        return session.get(SharedFile, path)


def chunk_count(db: Database, path: str) -> int:
    with db.read() as session:
        return session.scalar(select(func.count()).where(SharedFileChunk.path == path)) or 0


def test_a_file_published_from_one_data_dir_is_materialized_byte_identical_in_another(pg, dirs):
    a, b = dirs
    data = os.urandom(3 * CHUNK_BYTES + 12345)
    write(a, "bundles/abc", data)

    assert shared_files.publish(pg, a, "bundles/abc") is True
    assert not (b / "bundles/abc").exists()
    assert shared_files.materialize(pg, b, "bundles/abc") is True

    assert (b / "bundles/abc").read_bytes() == data
    row = shared_row(pg, "bundles/abc")
    assert row is not None and (row.size, row.chunks) == (len(data), 4)
    assert row.sha256 == hashlib.sha256(data).hexdigest()
    assert leftovers(b) == []
    # Already there: nothing read from the database (True at once).
    assert shared_files.materialize(pg, b, "bundles/abc") is True


def test_a_path_with_neither_a_file_nor_a_shared_copy_gives_false(pg, dirs):
    _, b = dirs
    assert shared_files.materialize(pg, b, "bundles/never-uploaded") is False
    assert not (b / "bundles").exists() or list((b / "bundles").iterdir()) == []


def test_a_damaged_chunk_is_refused_and_leaves_no_file_in_place(pg, dirs):
    a, b = dirs
    write(a, "files/job1/checkpoint.tar.gz", os.urandom(2 * CHUNK_BYTES + 7))
    shared_files.publish(pg, a, "files/job1/checkpoint.tar.gz")
    with pg.engine.begin() as connection:
        connection.execute(
            update(SharedFileChunk)
            .where(SharedFileChunk.path == "files/job1/checkpoint.tar.gz", SharedFileChunk.seq == 1)
            .values(data=b"\0" * CHUNK_BYTES)
        )

    with pytest.raises(SharedFileDamaged, match="damaged"):
        shared_files.materialize(pg, b, "files/job1/checkpoint.tar.gz")
    with pg.read() as session, pytest.raises(SharedFileDamaged, match="damaged"):
        shared_files.materialize(session, b, "files/job1/checkpoint.tar.gz")
    assert not (b / "files/job1/checkpoint.tar.gz").exists()
    assert leftovers(b) == []

    with pg.engine.begin() as connection:  # a lost chunk is refused as well
        connection.execute(
            SharedFileChunk.__table__.delete().where(
                SharedFileChunk.path == "files/job1/checkpoint.tar.gz", SharedFileChunk.seq == 2
            )
        )
    with pytest.raises(SharedFileDamaged, match="missing chunks"):
        shared_files.materialize(pg, b, "files/job1/checkpoint.tar.gz")
    assert not (b / "files/job1/checkpoint.tar.gz").exists()
    assert leftovers(b) == []


def test_republishing_the_same_content_is_a_no_op(pg, dirs):
    a, b = dirs
    data = os.urandom(CHUNK_BYTES + 1)
    write(a, "bundles/twice", data)
    write(b, "bundles/twice", data)  # the same bundle uploaded again, through the other replica
    assert shared_files.publish(pg, a, "bundles/twice") is True
    first = shared_row(pg, "bundles/twice")

    assert shared_files.publish(pg, b, "bundles/twice") is False
    assert shared_files.publish(pg, a, "bundles/twice", sha256=hashlib.sha256(data).hexdigest()) is False
    again = shared_row(pg, "bundles/twice")
    assert first is not None and again is not None and again.created_at == first.created_at
    assert chunk_count(pg, "bundles/twice") == 2


def test_a_file_that_changes_while_it_is_published_is_refused_and_nothing_is_stored(pg, dirs):
    a, _ = dirs
    write(a, "bundles/changing", b"new content")
    with pytest.raises(SharedFileDamaged, match="changed"):
        shared_files.publish(pg, a, "bundles/changing", sha256="0" * 64)
    assert shared_row(pg, "bundles/changing") is None
    assert chunk_count(pg, "bundles/changing") == 0


def test_a_replaced_checkpoint_serves_the_new_content_on_every_replica(pg, dirs):
    a, b = dirs
    task = Task(job_id="job000000002", attempt_number=1)
    files_a, files_b = a / "files", b / "files"
    for version in (b"checkpoint one" * 1000, b"checkpoint two" * 3000):
        spooled = write(a, "files/upload.tmp", version)
        digest = hashlib.sha256(version).hexdigest()
        files.share_checkpoint(pg, files_a, task, spooled, digest)  # as receive_task_files does
        files.install_checkpoint(files_a, task, spooled)

        for files_dir in (files_a, files_b):
            with pg.read() as session:
                path = files.latest_checkpoint(session, files_dir, "job000000002")
            assert path is not None and path.read_bytes() == version
    assert chunk_count(pg, "files/job000000002/checkpoint.tar.gz") == 1
    with pg.read() as session:
        assert files.latest_checkpoint(session, files_b, "job0000000ff") is None


def test_deletion_removes_the_shared_copy(pg, dirs):
    a, b = dirs
    write(a, "files/job3/checkpoint.tar.gz", b"x" * 100)
    root = "files/job3/artifacts/attempt-1"
    for name in ("model/weights.bin", "notes_%.txt", "gone.txt"):
        write(a, f"{root}/{name}", name.encode() * 10)
    write(a, "files/job3/artifacts/attempt-10/keep.txt", b"other attempt")
    shared_files.publish(pg, a, "files/job3/checkpoint.tar.gz")
    shared_files.publish(pg, a, "files/job3/artifacts/attempt-10/keep.txt")
    digests = [(n, shared_files.local_sha256(a / root / n)) for n in ("model/weights.bin", "notes_%.txt")]
    assert shared_files.publish_tree(pg, a, root, [*digests, ("gone.txt", "")]) == 3

    # A re-uploaded attempt without gone.txt: its shared copy is forgotten.
    (a / root / "gone.txt").unlink()
    shared_files.publish_tree(pg, a, root, digests)
    assert shared_row(pg, f"{root}/gone.txt") is None and chunk_count(pg, f"{root}/gone.txt") == 0
    assert shared_files.materialize(pg, b, f"{root}/notes_%.txt") is True

    shared_files.remove(pg, a, "files/job3/checkpoint.tar.gz")
    assert not (a / "files/job3/checkpoint.tar.gz").exists()
    assert shared_row(pg, "files/job3/checkpoint.tar.gz") is None
    assert shared_files.materialize(pg, b, "files/job3/checkpoint.tar.gz") is False

    shared_files.remove_tree(pg, a, root)
    assert not (a / root).exists()
    with pg.read() as session:
        left = session.scalars(select(SharedFile.path).where(SharedFile.path.like("files/job3/%"))).all()
        chunks = session.scalars(
            select(SharedFileChunk.path).where(SharedFileChunk.path.like(f"{root}/%"))
        ).all()
    # attempt-10 shares the prefix "attempt-1" as text, not as a directory: it stays.
    assert left == ["files/job3/artifacts/attempt-10/keep.txt"] and chunks == []


def test_a_5_mib_file_round_trips_in_1_mib_chunks_with_bounded_memory(pg, dirs):
    a, b = dirs
    data = os.urandom(5 * MIB)
    write(a, "bundles/big", data)

    tracemalloc.start()
    try:
        started = time.monotonic()
        shared_files.publish(pg, a, "bundles/big")
        published = time.monotonic()
        shared_files.materialize(pg, b, "bundles/big")
        done = time.monotonic()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (b / "bundles/big").read_bytes() == data
    with pg.read() as session:
        sizes = session.execute(
            select(SharedFileChunk.seq, func.length(SharedFileChunk.data))
            .where(SharedFileChunk.path == "bundles/big")
            .order_by(SharedFileChunk.seq)
        ).all()
    assert [tuple(r) for r in sizes] == [(seq, MIB) for seq in range(5)]
    # Never the whole file: a batch of chunks and its copies (driver buffers) at most.
    assert peak < (shared_files.BATCH_CHUNKS + 1) * 2 * MIB, peak
    print(
        f"5 MiB: publish {published - started:.2f} s, materialize {done - published:.2f} s, peak {peak / MIB:.1f} MiB"
    )


def test_concurrent_materializations_of_one_path_each_leave_the_whole_file(pg, dirs):
    a, b = dirs
    data = os.urandom(3 * MIB + 5)
    write(a, "bundles/raced", data)
    shared_files.publish(pg, a, "bundles/raced")
    errors: list[BaseException] = []

    def fetch(in_session: bool) -> None:
        try:
            if in_session:  # as bundle_for_agent does: in the request's read transaction
                with pg.read() as session:
                    assert shared_files.materialize(session, b, "bundles/raced")
            else:
                assert shared_files.materialize(pg, b, "bundles/raced", fresh=True)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=fetch, args=(n % 2 == 0,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert (b / "bundles/raced").read_bytes() == data
    assert leftovers(b) == []


def test_a_bundle_uploaded_through_one_replica_is_served_by_the_other(pg, dirs):
    a, b = dirs
    data = b"a bundle's bytes" * 5000
    digest = hashlib.sha256(data).hexdigest()
    spooled = write(a, "bundles/incoming.upload", data)
    bundles.share_bundle(pg, a / "bundles", spooled, digest)  # as the upload route does, then records it
    with pg.write() as session:
        bundles.record_bundle(session, a / "bundles", spooled, digest, len(data), "tar.gz", "b.tar.gz")

    with pg.read() as session:
        assert bundles.bundle_path(session, b / "bundles", digest).read_bytes() == data
        with pytest.raises(NotFound):
            bundles.bundle_path(session, b / "bundles", "f" * 64)
    with pg.read() as session:
        assert session.get(Bundle, digest) is not None


def test_on_sqlite_publish_and_materialize_touch_no_table(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'coordinator.db'}")
    upgrade_to_head(db.engine)
    try:
        a, b = tmp_path / "a", tmp_path / "b"
        write(a, "bundles/local", b"only here")
        assert shared_files.shared_engine(db) is None
        assert shared_files.publish(db, a, "bundles/local") is False
        assert shared_files.publish_tree(db, a, "bundles", [("local", "")]) == 0
        assert shared_files.materialize(db, a, "bundles/local") is True
        assert shared_files.materialize(db, b, "bundles/local") is False
        with db.read() as session:
            assert session.scalar(select(func.count()).select_from(SharedFile)) == 0
            assert session.scalar(select(func.count()).select_from(SharedFileChunk)) == 0
            assert files.latest_checkpoint(session, a / "files", "job000000001") is None
        shared_files.remove(db, a, "bundles/local")
        assert not (a / "bundles/local").exists()
    finally:
        db.dispose()
