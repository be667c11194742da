"""The agent's side of the archive limits: fetched bundles and checkpoints are capped while they stream
in, and what is extracted obeys the same ArchiveLimits as the coordinator's checks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms.archive import ArchiveLimitError, ArchiveLimits
from mwms.v1 import agent_pb2
from mwms.worker_agent.bundles import BundleCache, BundleError
from mwms.worker_agent.checkpoints import RestoreError, restore_checkpoint
from mwms_testkit.bombs import GIB, gzip_bomb

SMALL = ArchiveLimits(max_archive_bytes=3 * 1024 * 1024)


class Streams:
    """A stand-in for the coordinator's stub that streams `data` in 1 MiB chunks, counting what it sent."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.sent = 0

    def _chunks(self, *_args: object, **_kwargs: object) -> Iterator[agent_pb2.BundleChunk]:
        for start in range(0, len(self.data), 1024 * 1024):
            self.sent += 1
            yield agent_pb2.BundleChunk(data=self.data[start : start + 1024 * 1024])

    FetchBundle = _chunks
    FetchCheckpoint = _chunks


def test_a_bundle_over_the_limit_stops_streaming_and_leaves_nothing(tmp_path: Path) -> None:
    data = bytes(10 * 1024 * 1024)
    stub = Streams(data)
    cache = BundleCache(tmp_path / "bundles", stub, SMALL)  # type: ignore[arg-type]
    with pytest.raises(BundleError, match="MWMS_MAX_UPLOAD_BYTES"):
        cache.get(hashlib.sha256(data).hexdigest())
    assert stub.sent == 4 and list((tmp_path / "bundles").iterdir()) == []


def test_a_checkpoint_over_the_limit_or_a_bomb_is_not_restored(tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "job" / "checkpoints"
    checkpoint_dir.mkdir(parents=True)
    (checkpoint_dir / "mine.txt").write_text("kept")
    with pytest.raises(RestoreError, match="MWMS_MAX_UPLOAD_BYTES"):
        restore_checkpoint(Streams(bytes(10 * 1024 * 1024)), "job", checkpoint_dir, SMALL)  # type: ignore[arg-type]
    bomb = gzip_bomb(tmp_path / "bomb.tar.gz", 2 * GIB).read_bytes()
    with pytest.raises(ArchiveLimitError, match="MWMS_ARCHIVE_MAX_RATIO"):
        restore_checkpoint(Streams(bomb), "job", checkpoint_dir)  # type: ignore[arg-type]
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == ["checkpoints"]
    assert [p.name for p in checkpoint_dir.iterdir()] == ["mine.txt"]
