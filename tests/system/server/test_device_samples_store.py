"""Device telemetry on the coordinator: checks on samples, storage, downsampled series, retention.

Real databases: a SQLite file, and a throwaway PostgreSQL server where one can be started (the bucketing
SQL differs per dialect).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import func, select

from mwms.agent_link import MAX_DEVICES_PER_MESSAGE
from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Attempt, Bundle, DeviceSample, Job, Task
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.observing.device_series import MAX_POINTS, agent_series, bucket_seconds, job_series
from mwms.server.services.observing.device_telemetry import (
    IncomingSample,
    LatestSamples,
    check_samples,
    purge_before,
    retention_cutoff,
    sample_row,
    store_rows,
)

GPUS = frozenset({0, 1})
T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


def good(index: int = 0, util: float = 50.0, used: int = 100, temp: float = 60.0) -> IncomingSample:
    return IncomingSample(index, util, used, 81920, temp)


def test_every_bad_value_is_refused_on_its_own() -> None:
    bad = [
        IncomingSample(0, math.nan, 1, 2, 40.0),
        IncomingSample(0, math.inf, 1, 2, 40.0),
        IncomingSample(0, 1e308, 1, 2, 40.0),
        IncomingSample(0, -0.5, 1, 2, 40.0),
        IncomingSample(0, 5.0, -1, 2, 40.0),
        IncomingSample(0, 5.0, 3, 2, 40.0),  # more used than there is
        IncomingSample(0, 5.0, 1, 2**31, 40.0),  # beyond the column
        IncomingSample(0, 5.0, 1, 2, math.nan),
        IncomingSample(0, 5.0, 1, 2, -3.0),
        IncomingSample(0, 5.0, 1, 2, 1e308),
        IncomingSample(7, 5.0, 1, 2, 40.0),  # not a registered GPU
        IncomingSample(-1, 5.0, 1, 2, 40.0),
    ]
    for sample in bad:
        checked = check_samples([sample], GPUS)
        assert (checked.accepted, checked.refused) == ([], 1), sample
        assert checked.reason
    edges = [IncomingSample(0, 0.0, 0, 0, 0.0), IncomingSample(1, 100.0, 2**31 - 1, 2**31 - 1, 200.0)]
    assert check_samples(edges, GPUS).accepted == edges

    mixed = check_samples([good(0), IncomingSample(1, math.nan, 1, 2, 3.0), good(0, util=1.0), good(1)], GPUS)
    assert mixed.accepted == [good(0), good(1)] and mixed.refused == 2
    assert "NaN" in mixed.reason or "nan" in mixed.reason

    many = [good(0)] + [good(1)] * (MAX_DEVICES_PER_MESSAGE + 5)
    assert check_samples(many, GPUS).refused == MAX_DEVICES_PER_MESSAGE + 4  # duplicates and overflow
    assert check_samples([good(0)], frozenset()).refused == 1  # a CPU-only agent has no GPUs to report


def test_latest_samples_keep_the_newest_per_device() -> None:
    latest = LatestSamples()
    latest.put("a", [good(0, util=1.0), good(1, util=2.0)], T0)
    latest.put("a", [good(1, util=3.0)], T0 + timedelta(seconds=5))
    assert [(s.index, s.utilization_pct, s.at) for s in latest.of("a")] == [
        (0, 1.0, T0),
        (1, 3.0, T0 + timedelta(seconds=5)),
    ]
    latest.count_refused("a", 2)
    assert latest.refused("a") == 2 and latest.refused("b") == 0 and latest.agents() == ["a"]
    latest.forget("a")
    assert latest.of("a") == []


def test_retention_cutoff_takes_the_shorter_window() -> None:
    assert retention_cutoff(24, 30, T0) == T0 - timedelta(hours=24)
    assert retention_cutoff(24 * 60, 30, T0) == T0 - timedelta(days=30)
    assert retention_cutoff(0, 30, T0) == T0 - timedelta(days=30)
    assert retention_cutoff(6, 0, T0) == T0 - timedelta(hours=6)
    assert retention_cutoff(0, 0, T0) is None


def test_bucket_width_bounds_the_points() -> None:
    assert bucket_seconds(T0, T0 + timedelta(minutes=5)) == 5
    day = bucket_seconds(T0, T0 + timedelta(days=1))
    assert day * MAX_POINTS >= 86400 and (day - 1) * MAX_POINTS < 86400


# --- against a database -------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'devices.db'}"
    else:  # a fresh database on the session's PostgreSQL server (tests/conftest.py)
        url = request.getfixturevalue("postgres").create_database("devices")
    database = Database(url)
    upgrade_to_head(database.engine)
    try:
        yield database
    finally:
        database.dispose()


def _agent(db: Database, name: str, gpus: int) -> str:
    devices = [
        {"kind": "gpu", "index": i, "name": "g", "uuid": f"GPU-{i}", "memory_mib": 81920} for i in range(gpus)
    ]
    with db.write() as session:
        agent = register_agent(
            session,
            Registration(
                name,
                name,
                "127.0.0.1",
                20000,
                20010,
                devices or [{"kind": "cpu", "index": 0, "name": "s"}],
                "t",
            ),
            30,
        )
        return agent.id


def _store(db: Database, agent_id: str, index: int, at: datetime, util: float, used: int = 100) -> None:
    with db.write() as session:
        store_rows(session, [sample_row(agent_id, good(index, util=util, used=used), at)])


def test_series_are_bucketed_in_the_database(db: Database) -> None:
    agent_id = _agent(db, "gpu-a", 2)
    now = T0 + timedelta(minutes=10)
    rows = []
    for second in range(0, 600, 5):  # every 5 s for 10 minutes, two GPUs
        at = T0 + timedelta(seconds=second)
        rows += [
            sample_row(agent_id, good(0, util=10.0, used=second), at),
            sample_row(agent_id, good(1, util=90.0), at),
        ]
    with db.write() as session:
        store_rows(session, rows)
    with db.read() as session:
        width, series = agent_series(session, agent_id, minutes=10, now=now)
        assert width == 5
        assert [s.index for s in series] == [0, 1] and all(len(s.points) == 120 for s in series)
        assert series[0].points[0].at == T0 and series[0].points[-1].memory_used_mib == 595

        width, series = agent_series(session, agent_id, minutes=24 * 60, now=now)
        assert width == 360  # a day in at most MAX_POINTS buckets
        assert all(len(s.points) <= 3 for s in series)  # 10 minutes of samples fall into 2 or 3 buckets
        assert {p.utilization_pct for p in series[1].points} == {90.0}
        assert max(p.memory_used_mib for p in series[0].points) == 595  # the highest use in a bucket


def _job_with_tasks(db: Database, tasks: list[tuple[str, str, list[int], datetime, datetime | None]]) -> Job:
    with db.write() as session:
        if session.get(Bundle, "d" * 64) is None:
            session.add(Bundle(digest="d" * 64, size=1, archive_format="tar.gz"))
        job = Job(name="j", state="RUNNING", bundle_digest="d" * 64, command=["x"], num_workers=len(tasks))
        session.add(job)
        session.flush()
        attempt = Attempt(job_id=job.id, number=1, state="ACTIVE")
        session.add(attempt)
        session.flush()
        for index, (agent_id, kind, devices, started, ended) in enumerate(tasks):
            session.add(
                Task(
                    job_id=job.id,
                    attempt_id=attempt.id,
                    attempt_number=1,
                    index=index,
                    agent_id=agent_id,
                    host="127.0.0.1",
                    port=20000 + index,
                    device_kind=kind,
                    device_indices=devices,
                    state="RUNNING" if ended is None else "SUCCEEDED",
                    started_at=started,
                    ended_at=ended,
                )
            )
        return job


def test_a_jobs_tasks_get_their_own_devices_within_their_run(db: Database) -> None:
    gpu_a, gpu_b, cpu = _agent(db, "a", 2), _agent(db, "b", 1), _agent(db, "c", 0)
    for second in range(0, 300, 5):
        at = T0 + timedelta(seconds=second)
        readings = [(gpu_a, 0, 11.0), (gpu_a, 1, 22.0), (gpu_b, 0, 33.0)]
        with db.write() as session:
            store_rows(session, [sample_row(a, good(i, util=u), at) for a, i, u in readings])
    job = _job_with_tasks(
        db,
        [
            (gpu_a, "gpu", [1], T0 + timedelta(seconds=60), T0 + timedelta(seconds=120)),
            (gpu_b, "gpu", [0], T0 + timedelta(seconds=30), None),  # still running
            (cpu, "cpu", [0], T0, None),
        ],
    )
    with db.read() as session:
        found = job_series(session, session.get(Job, job.id), None, now=T0 + timedelta(seconds=300))
    assert found.attempt == 1 and found.bucket_seconds == 5
    first, second, third = found.tasks
    assert [s.index for s in first.series] == [1]  # its own device only, not GPU 0 of the same agent
    points = first.series[0].points
    assert {p.utilization_pct for p in points} == {22.0}
    assert T0 + timedelta(seconds=55) <= points[0].at and points[-1].at <= T0 + timedelta(seconds=120)
    assert len(points) in (12, 13)
    assert {p.utilization_pct for p in second.series[0].points} == {33.0}
    assert second.series[0].points[-1].at == T0 + timedelta(seconds=295)
    assert third.device_kind == "cpu" and third.series == []
    assert (first.agent_name, second.agent_name) == ("a", "b")
    # Each GPU's UUID, from the agent's registration (a JSON column on either database).
    assert [(t.device_uuids, [s.uuid for s in t.series]) for t in found.tasks] == [
        (["GPU-1"], ["GPU-1"]),
        (["GPU-0"], ["GPU-0"]),
        ([], []),
    ]

    with db.read() as session:
        none = job_series(
            session, session.get(Job, _job_with_tasks(db, [(cpu, "cpu", [0], T0, None)]).id), None
        )
    assert [t.series for t in none.tasks] == [[]]


def test_retention_deletes_old_samples_agent_by_agent_in_batches(db: Database) -> None:
    agents = [_agent(db, f"r{i}", 1) for i in range(3)]
    with db.write() as session:
        store_rows(
            session,
            [sample_row(a, good(0), T0 + timedelta(seconds=s)) for a in agents for s in range(0, 100, 5)],
        )
    before = T0 + timedelta(seconds=50)  # the 10 samples of each agent before this go
    with db.write() as session:
        deleted, more = purge_before(session, agents, before, max_rows=4)
    assert (deleted, more) == (12, True)
    with db.write() as session:
        deleted, more = purge_before(session, agents, before, max_rows=4)
        assert (deleted, more) == (12, True)
        deleted, more = purge_before(session, agents, before, max_rows=4)
        assert (deleted, more) == (6, False)
    with db.read() as session:
        left = session.execute(
            select(func.count(), func.min(DeviceSample.at)).select_from(DeviceSample)
        ).one()
    assert left[0] == 30 and left[1] == before


# --- the writer: checks on arrival, one transaction a second, retention ----------------------------------


def test_the_writer_checks_batches_and_purges(tmp_path: Path) -> None:
    import asyncio

    from mwms.server.live.device_ingest import DeviceTelemetryWriter
    from mwms.server.settings import Settings

    database = Database(f"sqlite:///{tmp_path / 'writer.db'}")
    upgrade_to_head(database.engine)
    agents = [_agent(database, f"w{i}", 8) for i in range(50)]
    settings = Settings(data_dir=tmp_path, device_sample_retention_hours=1)

    async def run() -> DeviceTelemetryWriter:
        writer = DeviceTelemetryWriter(database, settings)
        stream = object()
        for agent_id in agents:
            await writer.accept(stream, agent_id, [good(i, util=float(i)) for i in range(8)] + [good(9)])
        assert writer.stored == 0  # queued, not yet written
        await writer.flush()
        with database.write() as session:  # an hour-old sample of every agent: past the 1 h window
            store_rows(session, [sample_row(a, good(0), T0) for a in agents])
        await writer.purge()
        return writer

    writer = asyncio.run(run())
    assert writer.stored == 50 * 8 and writer.dropped == 0
    assert [s.utilization_pct for s in writer.latest.of(agents[0])] == [float(i) for i in range(8)]
    assert writer.latest.refused(agents[0]) == 1  # GPU 9 is not one it registered
    with database.read() as session:
        assert session.scalar(select(func.count()).select_from(DeviceSample)) == 50 * 8
        assert session.scalar(select(func.min(DeviceSample.at))) > T0
    database.dispose()
