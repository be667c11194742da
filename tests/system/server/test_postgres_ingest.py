"""Telemetry ingest on a real PostgreSQL server: COPY through a staging table, each (task, seq) stored once.

An agent that fails over to another coordinator replica resends what was not acknowledged, so the same
rows arrive twice, whole or overlapping, possibly at the same time on two replicas (skipped where no
PostgreSQL server can start).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from mwms import metrics_line
from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Bundle, Job, LogLine, MetricPoint, Task
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.observing import telemetry
from mwms.server.services.observing.telemetry import (
    IncomingLine,
    IncomingPoint,
    StoreOutcome,
    store_log_lines,
    store_metric_points,
    value_out,
)
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms_testkit.postgres_server import PostgresServer

pytest.importorskip("psycopg")

AT_MS = 1764500000000
STAGED = "pg_temp.mwms_staged_metric_points"


@pytest.fixture
def server(postgres: PostgresServer) -> PostgresServer:
    """The session's throwaway cluster (tests/conftest.py); each test gets its own database in it."""
    return postgres


@pytest.fixture
def db(server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[Database]:
    url = server.create_database(f"ingest_{request.node.name[:40].lower()}")
    database = Database(url)
    upgrade_to_head(database.engine)
    yield database
    database.dispose()


@pytest.fixture
def task_id(db: Database) -> str:
    """A placed task of a one-worker job."""
    with db.write() as session:
        session.add(Bundle(digest="b" * 64, size=1, archive_format="tar.gz"))
        slot = [{"kind": "cpu", "index": 0, "name": "cpu-slot-0"}]
        register_agent(session, Registration("pg-ingest", "h", "127.0.0.1", 20000, 20010, slot, "t"), 30)
        job = create_job(session, JobCreate(bundle_digest="b" * 64, command=["python", "x.py"], workers=1))
    with db.write() as session:
        schedule_pending(session)
    with db.read() as session:
        stored = session.get(Job, job.id)
        assert stored is not None
        return stored.attempts[0].tasks[0].id


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every batch that went through COPY."""
    seen: list[int] = []
    real = telemetry._copy_ignoring_duplicates

    def counted(session: Session, table: object, columns: tuple[str, ...], rows: list[tuple]) -> None:
        seen.append(len(rows))
        real(session, table, columns, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(telemetry, "_copy_ignoring_duplicates", counted)
    return seen


def _task(session: Session, task_id: str) -> Task:
    task = session.get(Task, task_id)
    assert task is not None
    return task


def _points(seqs: list[int], value: float = 0.5) -> list[IncomingPoint]:
    return [IncomingPoint(seq, "loss", seq, value, AT_MS + seq) for seq in seqs]


def _stored_seqs(session: Session, model: type[MetricPoint] | type[LogLine]) -> list[int]:
    return list(session.scalars(select(model.seq).order_by(model.seq)).all())


def test_a_copied_batch_reads_back_exactly(db: Database, task_id: str, copies: list[int]) -> None:
    values = [1.5, math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, -2.25, 0.1]
    names = ["loss", "λόγος/ünïcødé 🚀", "n" * metrics_line.MAX_NAME_LENGTH, "tab\there", "back\\slash"]
    points = [
        IncomingPoint(i + 1, names[i % len(names)], -(2**31) + i if i == 3 else i, v, AT_MS + i)
        for i, v in enumerate(values)
    ]
    texts = [
        "plain",
        "ünïcødé λ 🚀 中文",
        "x" * (64 * 1024),  # the agent's longest line
        "tab\tnewline\ncarriage\r\\N back\\slash",
        "a\x00b",  # PostgreSQL text cannot hold NUL: stored as U+FFFD, as before COPY
        "",
        "   ",
        "last",
    ]
    lines = [IncomingLine(i + 1, "stdout" if i % 2 else "stderr", t, AT_MS + i) for i, t in enumerate(texts)]
    with db.write() as session:
        task = _task(session, task_id)
        assert store_metric_points(session, task, points).rejected == 0
        assert store_log_lines(session, task, lines).rejected == 0
    assert copies == [len(points), len(lines)]
    with db.read() as session:
        stored = session.scalars(select(MetricPoint).order_by(MetricPoint.seq)).all()
        assert [(p.seq, p.name, p.step, p.attempt) for p in stored] == [
            (p.seq, p.name, p.step, 1) for p in points
        ]
        assert [value_out(p.value) for p in stored] == [metrics_line.json_value(v) for v in values]
        assert stored[4].value is not None and math.copysign(1, stored[4].value) == -1  # -0.0 keeps its sign
        assert stored[1].value is None  # NaN is NULL
        assert [p.wall_time for p in stored] == [
            datetime.fromtimestamp((AT_MS + i) / 1000, tz=timezone.utc) for i in range(len(points))
        ]
        assert all(p.job_id == task.job_id and p.task_id == task_id for p in stored)
        logged = session.scalars(select(LogLine).order_by(LogLine.seq)).all()
        assert [line.text for line in logged] == [t.replace("\x00", "\ufffd") for t in texts]
        assert [line.stream for line in logged] == [line.stream for line in lines]
        assert logged[0].at == datetime.fromtimestamp(AT_MS / 1000, tz=timezone.utc)


def test_a_resent_batch_is_stored_once(db: Database, task_id: str, copies: list[int]) -> None:
    with db.write() as session:
        task = _task(session, task_id)
        assert store_metric_points(session, task, _points(list(range(1, 41)))).acked_seq == 40
    with db.write() as session:  # the whole batch again, with other values: the first ones stay
        task = _task(session, task_id)
        outcome = store_metric_points(session, task, _points(list(range(1, 41)), value=9.0))
        assert (outcome.acked_seq, outcome.rejected) == (40, 0)
    with db.write() as session:  # overlapping by half
        task = _task(session, task_id)
        outcome = store_metric_points(session, task, _points(list(range(21, 61)), value=9.0))
        assert (outcome.acked_seq, outcome.rejected) == (60, 0)
    assert copies == [40, 40, 40]
    with db.read() as session:
        assert _stored_seqs(session, MetricPoint) == list(range(1, 61))
        values = {seq: value for seq, value in session.execute(select(MetricPoint.seq, MetricPoint.value))}
        assert {values[seq] for seq in range(1, 41)} == {0.5}
        assert {values[seq] for seq in range(41, 61)} == {9.0}


def test_a_seq_twice_in_one_batch_is_stored_once(db: Database, task_id: str, copies: list[int]) -> None:
    """ON CONFLICT DO NOTHING also skips a row that conflicts with another row of the same INSERT."""
    seqs = [1, 2, 3, 3, 4, 5, 5, 5, 6, 7, 8, 1]
    lines = [IncomingLine(seq, "stdout", f"line {seq}", AT_MS) for seq in seqs]
    with db.write() as session:
        task = _task(session, task_id)
        outcome = store_metric_points(session, task, _points(seqs))
        assert (outcome.acked_seq, outcome.rejected) == (8, 0)
        assert store_log_lines(session, task, lines).rejected == 0
    assert copies == [len(seqs), len(seqs)]
    with db.read() as session:
        assert _stored_seqs(session, MetricPoint) == list(range(1, 9))
        assert _stored_seqs(session, LogLine) == list(range(1, 9))


def test_a_row_the_database_refuses_is_refused_alone(
    db: Database, task_id: str, copies: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    lines = [IncomingLine(seq, "stdout", f"line {seq}", AT_MS) for seq in range(1, 11)]
    lines[4] = IncomingLine(5, "std\x00", "x", AT_MS)  # NUL in a varchar: refused by PostgreSQL
    with db.write() as session:
        task = _task(session, task_id)
        job_id = task.job_id
        outcome = store_log_lines(session, task, lines)
        assert (outcome.acked_seq, outcome.rejected) == (10, 1), outcome
        assert outcome.reason.startswith("seq 5: the database refused it (DataError")
        assert "COPY" not in outcome.reason and "INSERT" not in outcome.reason
        # A row of a task that does not exist (the foreign key): the rest of the batch is stored.
        rows = [
            {"job_id": job_id, "task_id": task_id, "attempt": 1, "seq": seq, "name": "loss"}
            | {"step": seq, "value": 0.5, "wall_time": datetime.now(timezone.utc)}
            for seq in range(1, 11)
        ]
        rows[6]["task_id"] = "no-such-task"
        rows[7]["step"] = 2**31  # over int4: refused by psycopg's binary COPY, then by the server
        refused = StoreOutcome()
        columns = telemetry.METRIC_COLUMNS
        values = [tuple(row[name] for name in columns) for row in rows]
        telemetry._insert_contained(session, MetricPoint, columns, values, refused, "metric_point")
        assert (refused.rejected, refused.reason) == (
            2,
            "seq 7: the database refused it (ForeignKeyViolation: "
            'insert or update on table "metric_points" violates foreign key constraint '
            '"metric_points_task_id_fkey") (and more)',
        )
    assert copies == [10, 10]  # the COPY of each batch, then row by row through the executemany
    assert "storing it row by row" in caplog.text
    with db.read() as session:
        assert _stored_seqs(session, LogLine) == [1, 2, 3, 4, 6, 7, 8, 9, 10]
        assert _stored_seqs(session, MetricPoint) == [1, 2, 3, 4, 5, 6, 9, 10]


def test_two_replicas_storing_overlapping_resends_at_once_both_commit(
    server: PostgresServer, db: Database, task_id: str, copies: list[int]
) -> None:
    """The second waits for the first's rows and skips them: no error, no deadlock, each seq once.

    The second batch comes in reverse order: the rows are inserted in seq order whatever the batch's.
    """
    other = Database(db.url)  # another replica: its own engine and connections
    waiting_done = threading.Event()
    errors: list[BaseException] = []

    def second_replica() -> None:
        try:
            with other.write() as session:
                outcome = store_metric_points(
                    session, _task(session, task_id), _points(list(range(80, 20, -1)))
                )
                assert outcome.rejected == 0
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)
        finally:
            waiting_done.set()

    try:
        with db.write() as session:
            assert (
                store_metric_points(session, _task(session, task_id), _points(list(range(1, 61)))).rejected
                == 0
            )
            second = threading.Thread(target=second_replica)
            second.start()
            observed = _wait_for_a_lock_wait(db, waiting_done)
            assert observed, f"the second replica never waited for the first one's rows: {errors}"
        second.join(30)
        assert not second.is_alive() and errors == [], errors
    finally:
        other.dispose()
    assert copies == [60, 60]
    with db.read() as session:
        assert _stored_seqs(session, MetricPoint) == list(range(1, 81))


def _wait_for_a_lock_wait(db: Database, done: threading.Event) -> bool:
    """Polls (on a connection of its own) until a backend waits for a lock; False when `done` first."""
    deadline = time.monotonic() + 20
    with db.engine.connect() as conn:
        while time.monotonic() < deadline and not done.is_set():
            waiting = conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )
            conn.rollback()
            if waiting:
                return True
            time.sleep(0.02)
    return False


def test_the_staging_table_keeps_nothing_between_transactions(
    db: Database, task_id: str, copies: list[int]
) -> None:
    """Created in the transaction and dropped at its end, on one pooled connection, commit or rollback."""

    def backend_and_staged(session: Session) -> tuple[int, str | None]:
        pid = session.scalar(text("SELECT pg_backend_pid()"))
        staged = session.scalar(text(f"SELECT to_regclass('{STAGED}')::text"))
        return pid, staged

    with db.write() as session:
        task = _task(session, task_id)
        pid, before = backend_and_staged(session)
        assert before is None
        for start in (1, 11, 21):  # three batches in one transaction
            store_metric_points(session, task, _points(list(range(start, start + 10))))
            assert session.scalar(text(f"SELECT count(*) FROM {STAGED}")) == 0
    with db.write() as session:
        assert backend_and_staged(session) == (pid, None)
    with pytest.raises(RuntimeError), db.write() as session:
        store_metric_points(session, _task(session, task_id), _points(list(range(31, 41))))
        raise RuntimeError("the transaction's owner gives up")
    with db.write() as session:
        assert backend_and_staged(session) == (pid, None)
        store_metric_points(session, _task(session, task_id), _points(list(range(31, 41))))
    assert copies == [10] * 5
    with db.read() as session:
        assert backend_and_staged(session) == (pid, None)
        assert _stored_seqs(session, MetricPoint) == list(range(1, 41))
        assert session.scalar(select(func.count()).select_from(MetricPoint)) == 40
