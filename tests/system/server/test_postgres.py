"""The same Alembic chain and the same services on a real PostgreSQL server (skipped where none can start)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, inspect, select

from mwms.server.db.engine import Database
from mwms.server.db.migrate import downgrade_to, upgrade_to_head
from mwms.server.db.models import Agent, Base, Bundle, Job, LogLine, MetricPoint, utcnow
from mwms.server.live.liveness import Liveness
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.job_life.jobs import SubmitPolicy, cancel_job, create_job, set_priority
from mwms.server.services.json_values import as_text
from mwms.server.services.observing.telemetry import (
    IncomingLine,
    IncomingPoint,
    read_metrics,
    store_log_lines,
    store_metric_points,
    value_out,
)
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.services.scheduler.waiting_jobs import WaitingJobs
from mwms.server.settings import Settings
from mwms_testkit.in_process_coordinator import background_loops


@pytest.fixture
def postgres_url(postgres, request: pytest.FixtureRequest) -> str:
    """A fresh database of its own for each test, on the session's PostgreSQL server (tests/conftest.py)."""
    return postgres.create_database("pg_" + request.node.name.lower()[:50])


def test_migrations_run_both_ways_on_postgres(postgres_url):
    pytest.importorskip("psycopg")
    db = Database(postgres_url)
    upgrade_to_head(db.engine)
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == [], diff
    downgrade_to(db.engine, "base")
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    upgrade_to_head(db.engine)
    db.dispose()


def test_jobs_are_placed_and_cancelled_on_postgres(postgres_url):
    pytest.importorskip("psycopg")
    db = Database(postgres_url)
    upgrade_to_head(db.engine)
    with db.write() as session:
        session.add(Bundle(digest="b" * 64, size=1, archive_format="tar.gz"))
        for name in ("pg-1", "pg-2"):
            register_agent(
                session,
                Registration(
                    name,
                    name,
                    "127.0.0.1",
                    20000,
                    20010,
                    [{"kind": "cpu", "index": 0, "name": "cpu-slot-0"}],
                    "t",
                ),
                30,
            )
        job = create_job(session, JobCreate(bundle_digest="b" * 64, command=["python", "x.py"], workers=2))
    with db.write() as session:
        assert len(schedule_pending(session)) == 2
    with db.write() as session:
        task = session.get(Job, job.id).attempts[0].tasks[0]
        lines = [IncomingLine(seq, "stdout", f"line {seq}", 0) for seq in (1, 2, 3)]
        assert store_log_lines(session, task, lines).acked_seq == 3
        assert store_log_lines(session, task, lines[1:]).acked_seq == 3  # a resend stores nothing twice
        assert session.scalar(select(func.count()).select_from(LogLine)) == 3
    with db.write() as session:
        placed = cancel_job(session, job.id)
        assert placed.state == "CANCELLED"
        assert all(t.stop_requested for t in placed.attempts[0].tasks)
    db.dispose()


def test_non_finite_metrics_and_poison_rows_on_postgres(postgres_url):
    """NaN is stored as NULL, +-Infinity as themselves; a NUL or an out-of-range value refuses only its row."""
    pytest.importorskip("psycopg")
    db = Database(postgres_url)
    upgrade_to_head(db.engine)
    with db.write() as session:
        if session.get(Bundle, "d" * 64) is None:
            session.add(Bundle(digest="d" * 64, size=1, archive_format="tar.gz"))
        register_agent(
            session,
            Registration(
                "pg-nan", "h", "127.0.0.1", 20000, 20010, [{"kind": "cpu", "index": 0, "name": "s"}], "t"
            ),
            30,
        )
        job = create_job(session, JobCreate(bundle_digest="d" * 64, command=["python", "x.py"], workers=1))
    with db.write() as session:
        schedule_pending(session)
    with db.write() as session:
        job = session.get(Job, job.id)
        task = job.attempts[0].tasks[0]
        values = [1.5, float("nan"), float("inf"), float("-inf"), -0.0, 1e308, 5e-324]
        points = [IncomingPoint(i + 1, "loss", i, v, 1764500000000) for i, v in enumerate(values)]
        points.append(IncomingPoint(len(values) + 1, "loss", 2**31, 1.0, 1764500000000))  # step over int4
        outcome = store_metric_points(session, task, points)
        assert (outcome.acked_seq, outcome.rejected) == (len(values) + 1, 1), outcome
        lines = [
            IncomingLine(1, "stdout", "a\x00b", 0),
            IncomingLine(2, "stdout", "ok", 10**18),  # refused by its bounds
            IncomingLine(3, "std\x00", "x", 0),  # refused by the database: the batch is stored row by row
            IncomingLine(4, "stderr", "after", 0),
        ]
        logged = store_log_lines(session, task, lines)
        assert (logged.acked_seq, logged.rejected) == (4, 2), logged
        assert "seq 2: time" in logged.reason and "INSERT" not in logged.reason
    with db.read() as session:
        stored, _ = read_metrics(
            session, session.get(Job, job.id), name="loss", min_step=None, max_step=None, attempt=None
        )
        assert [value_out(p.value) for p in stored] == [
            1.5,
            "NaN",
            "Infinity",
            "-Infinity",
            -0.0,
            1e308,
            5e-324,
        ]
        assert (
            session.scalar(select(func.count()).select_from(MetricPoint).where(MetricPoint.value.is_(None)))
            == 1
        )
        assert session.scalars(select(LogLine.text).where(LogLine.task_id == task.id)).all() == [
            "a\ufffdb",
            "after",
        ]
    db.dispose()


def test_waiting_for_the_writer_does_not_age_liveness_on_postgres(postgres_url, tmp_path):
    """A reconciler pass that waits for the writer (a long telemetry transaction holds it) decides who is
    lost as of when it took the heartbeats it writes: an agent heard from just before is not lost.

    Found by bench/run.py --db postgres: on a loaded machine the ingest scenario's streaming agents were
    declared lost ("stopped heartbeating for 10-13 s") while their heartbeats were acked within 4 s.
    """
    pytest.importorskip("psycopg")
    db = Database(postgres_url)
    upgrade_to_head(db.engine)
    with db.write() as session:
        agent = register_agent(
            session,
            Registration(
                "pg-busy-writer",
                "h",
                "127.0.0.1",
                20000,
                20010,
                [{"kind": "cpu", "index": 0, "name": "s"}],
                "t",
            ),
            30,
        )
    settings = Settings(data_dir=tmp_path, agent_timeout_s=0.5)
    holding = threading.Event()

    def hold_the_writer() -> None:
        with db.write():
            holding.set()
            time.sleep(1.5)  # three agent timeouts

    async def one_pass() -> None:
        liveness = Liveness()
        loops = background_loops(db, settings, liveness)
        holder = threading.Thread(target=hold_the_writer)
        holder.start()
        holding.wait(10)
        liveness.seen(agent.id)  # heard from now; the pass below waits 1.5 s for the writer
        await loops._flush_and_reconcile()
        assert loops._reconciling is not None
        await loops._reconciling  # the reconcile runs apart from the flush's loop
        holder.join()

    asyncio.run(one_pass())
    with db.read() as session:
        stored = session.get(Agent, agent.id)
        assert stored is not None and stored.lost_at is None, (stored.last_heartbeat_at, stored.lost_at)
    db.dispose()


def test_the_waiting_jobs_cache_catches_an_event_committed_behind_a_newer_one_on_postgres(postgres_url):
    """On PostgreSQL events can commit out of id order: an event that was not visible when the cache read
    the newer one is still caught (the cache looks at the last events again and reads the jobs of those it
    has not seen); the scheduler's hot reads get JSON columns as text, not parsed by the driver."""
    pytest.importorskip("psycopg")
    db = Database(postgres_url)
    upgrade_to_head(db.engine)
    with db.write() as session:
        session.add(Bundle(digest="c" * 64, size=1, archive_format="tar.gz"))
    first, second = (
        _submit(db, JobCreate(bundle_digest="c" * 64, command=["python", "x.py"], workers=2))
        for _ in range(2)
    )
    cache = WaitingJobs()
    with db.read() as session:
        assert {j.job_id for j in cache.read(session, utcnow())} == {first, second}
    with db.write_unserialised() as slow:  # its event takes an id first, and commits last
        set_priority(slow, first, 700, by="u", policy=SubmitPolicy(), any_owner=True)
        slow.flush()
        with db.write_unserialised() as fast:
            set_priority(fast, second, 600, by="u", policy=SubmitPolicy(), any_owner=True)
        with db.read() as session:
            seen = {j.job_id: j.priority for j in cache.read(session, utcnow())}
        assert seen == {first: 500, second: 600}, seen  # the slow one is not visible yet
    with db.read() as session:
        assert {j.job_id: j.priority for j in cache.read(session, utcnow())} == {first: 700, second: 600}
        texts = session.scalars(select(as_text(Job.options))).all()
    assert texts and all(isinstance(text, str) for text in texts), texts
    db.dispose()


def _submit(db: Database, spec: JobCreate) -> str:
    with db.write() as session:
        return create_job(session, spec, submitted_by="u").id
