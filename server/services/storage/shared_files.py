"""Files of the data dir kept in the database too, so that every coordinator replica can serve them.

Bundles (`bundles/<digest>`), checkpoints (`files/<job>/checkpoint.tar.gz`) and artifacts
(`files/<job>/artifacts/attempt-N/...`) are written to the data dir of the replica that received them. With
several replicas on one PostgreSQL database, that replica also stores the content as SharedFileChunk rows
(1 MiB each) and a SharedFile row (`publish`), and a replica asked for a file it lacks writes it into its
own data dir from those rows (`materialize`). On SQLite only one coordinator runs and its data dir is the
only copy: every function here is then a no-op on the database side (`shared_engine` is the one place
that tells the dialects apart).

Transactions. `publish` never runs inside the coordinator's writer transaction (`Database.write()` holds the
replicas' global writer lock, and copying a few hundred MB would stall every replica): it runs one
transaction of its own per file on a connection from the engine, holding only a per-path advisory lock
(concurrent publishers of one path line up; readers are not blocked), and writes the chunks first and the
SharedFile row last, so the row's commit is the commit point and no reader ever sees half a file. A
replaced file (a job's checkpoint) is deleted and inserted again in that same transaction. `materialize`
reads a few chunks per query into a temp file (a unique name) next to the target, checks size and sha256
and renames it into place (os.replace: the rename is the commit point, and every file renamed is whole).
Given a session it reads in the caller's read transaction (no second pooled connection per fetch); a
replacement committed mid-copy then fails the sha256 check and the new content is copied instead. Given a
Database or an engine it reads in a REPEATABLE READ transaction of its own (one snapshot). Threads of one
process that want the same missing path wait for the first one instead of each copying it.

Hook points (each keeps the service function's contract):
- Bundles: the upload route (server/api/bundles.py) calls `bundles.share_bundle` in the archive workers'
  pool after the archive was checked and before `record_bundle`'s write transaction. Sharing the spooled
  file before the Bundle row exists means that no job can be placed on a bundle another replica cannot
  serve, and the copy runs outside the writer lock. `bundles.bundle_path` materializes a missing file.
- Checkpoints: `agent_uploads.receive_task_files` (outside any transaction, in the archive pool) calls
  `files.share_checkpoint` before `files.install_checkpoint` moves the archive into place; publishing
  first means a replica's local copy is never newer than the shared one, so the freshness check of
  `files.latest_checkpoint` (used by `agent_auth.checkpoint_for_agent`) can refresh a stale local copy
  (a checkpoint replaced through another replica) without ever undoing a new one.
- Artifacts: `receive_task_files` calls `files.share_artifacts` after `files.unpack_artifacts` and before
  `files.record_artifacts`, so a recorded artifact can be served by every replica; it also forgets shared
  files the attempt's new upload no longer has (the local directory is replaced the same way).
  `files.artifact_file` materializes a missing file. An attempt's artifacts are uploaded once (after the
  task ended), so a local copy is not checked for freshness.
- Removal: the coordinator deletes no bundle, checkpoint or artifact today (retention deletes log lines
  and metric points only; there is no bundle garbage collection). `remove` and `remove_tree` delete the
  local and the shared copy together, for whoever deletes such files; `publish_tree` uses the same
  deletion for the files a re-uploaded attempt dropped.

Memory stays bounded: a file is read and written CHUNK_BYTES at a time, at most BATCH_CHUNKS chunks are
held at once on either side.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from sqlalchemy import Connection, Engine, delete, insert, select
from sqlalchemy.orm import Session

from mwms.server.db import locks
from mwms.server.db.models import SharedFile, SharedFileChunk, utcnow

CHUNK_BYTES = 1024 * 1024
# Chunks per INSERT (executemany) and per SELECT: at most this many MiB of a file in memory at once.
BATCH_CHUNKS = 4
TEMP_SUFFIX = ".shared-partial"
# Local files whose sha256 is known, by identity (device, inode, size, mtime): the freshness check of a
# replaceable file then costs one stat. A rename keeps the identity, so a file published from its spool
# is known once it is moved into place.
_KNOWN_LIMIT = 4096
_known: dict[tuple[int, int, int, int], str] = {}
_known_guard = threading.Lock()


@dataclass
class _Copying:
    """A path being materialized in this process, and how many threads want it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    waiters: int = 0


_copying: dict[str, _Copying] = {}
_copying_guard = threading.Lock()
MAX_REPLACED_WHILE_COPIED = 3


class SharedFileDamaged(RuntimeError):
    """A shared file's chunks do not add up to its recorded size and sha256 (or a publish saw its file
    change while it was being read); nothing was put in place."""


class HasEngine(Protocol):
    """A Database (server/db/engine.py), an Engine or a Connection: each has `.engine`."""

    @property
    def engine(self) -> Engine: ...


Bind = HasEngine | Session


def shared_engine(db: Bind) -> Engine | None:
    """The engine that files are shared through; None on SQLite, where the data dir is the only copy.
    The one place that tells the dialects apart."""
    engine = _engine(db)
    return engine if engine.dialect.name == "postgresql" else None


def engine_of(session: Session) -> Engine:
    """The engine behind `session` (for a caller that has only transaction runners to hand a session)."""
    return _engine(session)


def _engine(db: Bind) -> Engine:
    if isinstance(db, Session):
        return db.get_bind().engine
    return db.engine


def shared_name(data_dir: Path, file: Path) -> str:
    """The name a file of the data dir is shared under: its path relative to the data dir, e.g.
    "bundles/<digest>"."""
    return _checked(file.relative_to(data_dir).as_posix())


def _checked(path: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or str(pure) != path:
        raise ValueError(f"shared file path {path!r} must be a normalized path relative to the data dir")
    return path


def publish(db: Bind, data_dir: Path, path: str, *, source: Path | None = None, sha256: str = "") -> bool:
    """Stores the content of `data_dir/path` (or of `source`, about to be moved there) as the shared copy
    of `path`, replacing another content; True when it stored it, False when the same content was there
    already or on SQLite. `sha256`, when the caller knows it, saves a read and is checked while copying."""
    engine = shared_engine(db)
    if engine is None:
        return False
    path = _checked(path)
    file = source if source is not None else data_dir / path
    digest = sha256 or local_sha256(file)
    with engine.begin() as connection:
        locks.wait_for(connection, _path_lock(path))
        current = connection.scalar(select(SharedFile.sha256).where(SharedFile.path == path))
        if current == digest:
            _remember(file, digest)
            return False
        _delete_paths(connection, [path])
        with file.open("rb") as content:
            size, chunks, copied = _insert_chunks(connection, path, content)
        if copied != digest:
            raise SharedFileDamaged(
                f"{file} changed while it was being shared (sha256 {copied}, expected {digest}); "
                "upload it again"
            )
        connection.execute(
            insert(SharedFile).values(path=path, size=size, sha256=digest, chunks=chunks, created_at=utcnow())
        )
    _remember(file, digest)
    return True


def _insert_chunks(connection: Connection, path: str, content: BinaryIO) -> tuple[int, int, str]:
    hasher = hashlib.sha256()
    size = seq = 0
    batch: list[dict[str, object]] = []
    while data := content.read(CHUNK_BYTES):
        hasher.update(data)
        size += len(data)
        batch.append({"path": path, "seq": seq, "data": data})
        seq += 1
        if len(batch) >= BATCH_CHUNKS:
            connection.execute(insert(SharedFileChunk), batch)
            batch = []
    if batch:
        connection.execute(insert(SharedFileChunk), batch)
    return size, seq, hasher.hexdigest()


def publish_tree(db: Bind, data_dir: Path, directory: str, files: Iterable[tuple[str, str]]) -> int:
    """Publishes `files` ((path under `directory`, sha256) each) and forgets the shared files under
    `directory` that are not among them; returns how many it stored."""
    if shared_engine(db) is None:
        return 0
    directory = _checked(directory)
    keep: set[str] = set()
    stored = 0
    for relative, digest in files:
        path = f"{directory}/{relative}"
        keep.add(path)
        stored += publish(db, data_dir, path, sha256=digest)
    engine = shared_engine(db)
    assert engine is not None
    with engine.begin() as connection:
        under = connection.scalars(
            select(SharedFile.path).where(SharedFile.path.startswith(directory + "/", autoescape=True))
        ).all()
        _delete_paths(connection, [p for p in under if p not in keep])
    return stored


def materialize(db: Bind, data_dir: Path, path: str, *, fresh: bool = False) -> bool:
    """Makes sure `data_dir/path` is there, writing it from the shared copy when it is missing (or, with
    `fresh`, when its content is not the shared one's: a file replaced through another replica); False
    when there is neither a local file nor a shared copy. SharedFileDamaged, and no file written, when the
    shared copy does not check out."""
    path = _checked(path)
    target = data_dir / path
    engine = shared_engine(db)
    # Whatever is in the way counts as there (the caller opens it, and reports what it found).
    if engine is None or (not fresh and target.exists()):
        return target.exists()
    with _one_at_a_time(target):
        if not fresh and target.exists():  # written by the thread this one waited for
            return True
        if isinstance(db, Session):
            # The caller's read transaction: no second pooled connection per request (a gang's agents
            # fetching one bundle at once would otherwise hold two each, and could exhaust the pool).
            return _materialize(db.connection(), path, target)
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as connection:
            with connection.begin():
                return _materialize(connection, path, target)


def _materialize(connection: Connection, path: str, target: Path) -> bool:
    query = select(SharedFile.size, SharedFile.sha256, SharedFile.chunks).where(SharedFile.path == path)
    for _ in range(MAX_REPLACED_WHILE_COPIED + 1):
        row = connection.execute(query).first()
        if row is None:
            return target.exists()
        if target.is_file() and local_sha256(target) == row.sha256:
            return True
        try:
            _copy_out(connection, path, target, row.size, row.sha256, row.chunks)
            return True
        except SharedFileDamaged:
            # In a READ COMMITTED transaction a replacement (a new checkpoint) committed mid-copy mixes
            # two contents: copy the new one. The same content failing again is damage.
            if connection.scalar(select(SharedFile.sha256).where(SharedFile.path == path)) == row.sha256:
                raise
    raise SharedFileDamaged(
        f"the shared copy of {path} was replaced {MAX_REPLACED_WHILE_COPIED} times while copied"
    )


@contextmanager
def _one_at_a_time(target: Path) -> Iterator[None]:
    """One materialization of a path at a time in this process: the others wait and then find the file
    instead of each copying it again."""
    key = str(target)
    with _copying_guard:
        entry = _copying.setdefault(key, _Copying())
        entry.waiters += 1
    try:
        with entry.lock:
            yield
    finally:
        with _copying_guard:
            entry.waiters -= 1
            if entry.waiters == 0:
                del _copying[key]


def _copy_out(connection: Connection, path: str, target: Path, size: int, digest: str, chunks: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
    temp = Path(name)
    try:
        hasher = hashlib.sha256()
        written = 0
        with os.fdopen(fd, "wb") as out:
            for start in range(0, chunks, BATCH_CHUNKS):
                rows = connection.execute(
                    select(SharedFileChunk.seq, SharedFileChunk.data)
                    .where(
                        SharedFileChunk.path == path,
                        SharedFileChunk.seq >= start,
                        SharedFileChunk.seq < start + BATCH_CHUNKS,
                    )
                    .order_by(SharedFileChunk.seq)
                ).all()
                expected = list(range(start, min(start + BATCH_CHUNKS, chunks)))
                if [seq for seq, _ in rows] != expected:
                    raise SharedFileDamaged(f"the shared copy of {path} is missing chunks {expected}")
                for _, data in rows:
                    hasher.update(data)
                    written += len(data)
                    out.write(data)
        if written != size or hasher.hexdigest() != digest:
            raise SharedFileDamaged(
                f"the shared copy of {path} is damaged ({written} bytes, sha256 {hasher.hexdigest()}; "
                f"recorded {size} bytes, sha256 {digest}): upload the file again"
            )
        _remember(temp, digest)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def remove(db: Bind, data_dir: Path, path: str) -> None:
    """Deletes `data_dir/path` and its shared copy."""
    path = _checked(path)
    (data_dir / path).unlink(missing_ok=True)
    engine = shared_engine(db)
    if engine is not None:
        with engine.begin() as connection:
            _delete_paths(connection, [path])


def remove_tree(db: Bind, data_dir: Path, directory: str) -> None:
    """Deletes the directory `data_dir/directory` and the shared copies of every file under it."""
    directory = _checked(directory)
    shutil.rmtree(data_dir / directory, ignore_errors=True)
    engine = shared_engine(db)
    if engine is None:
        return
    prefix = directory + "/"
    with engine.begin() as connection:
        connection.execute(delete(SharedFile).where(SharedFile.path.startswith(prefix, autoescape=True)))
        connection.execute(
            delete(SharedFileChunk).where(SharedFileChunk.path.startswith(prefix, autoescape=True))
        )


def _delete_paths(connection: Connection, paths: list[str]) -> None:
    # The row first: a reader that finds no row reads no chunks.
    for start in range(0, len(paths), 500):
        some = paths[start : start + 500]
        connection.execute(delete(SharedFile).where(SharedFile.path.in_(some)))
        connection.execute(delete(SharedFileChunk).where(SharedFileChunk.path.in_(some)))


def _path_lock(path: str) -> int:
    return locks.lock_key(f"shared-file:{path}")


def local_sha256(file: Path) -> str:
    """The sha256 of a local file; read once per version of the file (known ones cost a stat)."""
    identity = _identity(file)
    with _known_guard:
        known = _known.get(identity)
    if known is not None:
        return known
    with file.open("rb") as content:
        digest = hashlib.file_digest(content, "sha256").hexdigest()
    _remember(file, digest, identity)
    return digest


def _identity(file: Path) -> tuple[int, int, int, int]:
    stat = file.stat()
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _remember(file: Path, digest: str, identity: tuple[int, int, int, int] | None = None) -> None:
    try:
        identity = identity or _identity(file)
    except OSError:
        return
    with _known_guard:
        if len(_known) >= _KNOWN_LIMIT:
            _known.clear()
        _known[identity] = digest
