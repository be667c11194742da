"""The bundle cache is the agent's alone (0700, files 0600) and every use hashes the cached copy again: a
copy changed on disk is logged, thrown away and fetched again, so a task runs the code its digest names."""

from __future__ import annotations

import hashlib
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms.v1 import agent_pb2
from mwms.worker_agent.bundles import BundleCache
from mwms_testkit.agent_builders import connected, start_task
from mwms_testkit.cluster import pack

S = agent_pb2
GENUINE = pack({"train.py": "print('genuine code', flush=True)\n"})
FORGED = pack({"train.py": "print('forged code', flush=True)\n"})


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


class CountingStub:
    """Streams `data` as the coordinator's FetchBundle would, counting the fetches."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.fetches = 0

    def FetchBundle(self, *_args: object, **_kwargs: object) -> Iterator[agent_pb2.BundleChunk]:
        self.fetches += 1
        yield agent_pb2.BundleChunk(data=self.data)


def test_a_tampered_cached_bundle_is_fetched_again_and_the_task_runs_the_genuine_code(
    coordinator, start_agent, wait_for, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    fake, address = coordinator
    agent = start_agent(address)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(GENUINE)

    def run(task_id: str, job_id: str) -> list[str]:
        stream.send(start=start_task(task_id, digest, job_id=job_id))
        wait_for(
            lambda: S.TASK_STATE_SUCCEEDED in fake.states(task_id),
            f"{task_id} SUCCEEDED",
            observed=lambda: fake.reports(task_id),
        )
        return [line.text for line in fake.log_lines(task_id)]

    assert run("task-1", "job-1") == ["genuine code"]
    work_dir = agent.config.work_dir
    cached = work_dir / "bundles" / digest
    assert (mode_of(work_dir), mode_of(work_dir / "bundles"), mode_of(cached)) == (0o700, 0o700, 0o600)

    cached.write_bytes(FORGED)  # what a job could do if it could write the cache
    assert run("task-2", "job-2") == ["genuine code"]
    assert fake.bundle_fetches == [digest, digest]
    assert cached.read_bytes() == GENUINE and mode_of(cached) == 0o600
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(digest[:12] in m and "changed on disk" in m for m in warnings), warnings

    assert run("task-3", "job-3") == ["genuine code"]  # intact now: used without a fetch
    assert fake.bundle_fetches == [digest, digest]
    assert agent.shut_down() == 0


def test_a_link_or_directory_in_place_of_a_bundle_is_replaced_by_the_genuine_file(tmp_path: Path) -> None:
    digest = hashlib.sha256(GENUINE).hexdigest()
    stub = CountingStub(GENUINE)
    cache = BundleCache(tmp_path / "bundles", stub)  # type: ignore[arg-type]
    path = cache.get(digest)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(GENUINE)  # even the right bytes: a link can be pointed elsewhere later
    path.unlink()
    path.symlink_to(elsewhere)
    assert cache.get(digest) == path and not path.is_symlink() and path.read_bytes() == GENUINE
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")
    assert cache.get(digest) == path and path.is_file() and path.read_bytes() == GENUINE
    assert stub.fetches == 3 and elsewhere.read_bytes() == GENUINE


def test_a_planted_partial_file_or_link_is_not_written_through(tmp_path: Path) -> None:
    digest = hashlib.sha256(GENUINE).hexdigest()
    directory = tmp_path / "bundles"
    directory.mkdir(mode=0o700)
    target = tmp_path / "target"
    target.write_text("untouched")
    (directory / f"{digest}.partial").symlink_to(target)
    path = BundleCache(directory, CountingStub(GENUINE)).get(digest)  # type: ignore[arg-type]
    assert path.read_bytes() == GENUINE and target.read_text() == "untouched"
    assert sorted(p.name for p in directory.iterdir()) == [digest]


def test_a_cache_open_to_others_is_restricted_with_its_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    digest = hashlib.sha256(GENUINE).hexdigest()
    directory = tmp_path / "bundles"
    directory.mkdir()
    directory.chmod(0o777)
    (directory / digest).write_bytes(GENUINE)
    (directory / digest).chmod(0o666)
    other = directory / ("0" * 64)
    other.write_bytes(b"an older bundle")
    other.chmod(0o644)
    stub = CountingStub(GENUINE)
    assert BundleCache(directory, stub).get(digest) == directory / digest  # type: ignore[arg-type]
    assert stub.fetches == 0
    assert (mode_of(directory), mode_of(directory / digest), mode_of(other)) == (0o700, 0o600, 0o600)
    assert "open to other users" in caplog.text
