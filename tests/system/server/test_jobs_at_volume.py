"""Jobs at volume: SQL statements per request do not grow with the page size; retention deletes old telemetry.

Statements are counted with SQLAlchemy's before_cursor_execute event on the coordinator's real SQLite
engine. Timings are the benchmark's business (bench/jobs_at_volume.py), not these tests'.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from test_postgres import postgres_url  # noqa: F401 - the real PostgreSQL the suite starts

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent, Attempt, Bundle, Job, LogLine, MetricPoint, Task, utcnow
from mwms.server.services.job_life.jobs import list_jobs, read_job
from mwms.server.services.observing.retention import PurgeCursor, cutoff, purge_batch
from mwms.server.services.observing.telemetry import latest_progress
from mwms.server.states import JobState
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings
from mwms_testkit.sql_statements import recorded

ADMIN_TOKEN = "mwms_admin-token-for-volume-tests-0123456"
DIGEST = hashlib.sha256(b"volume").hexdigest()


@dataclass
class Coordinator(InProcessCoordinator):
    @contextmanager
    def counting(self) -> Iterator[list[str]]:
        """Collects the SQL statements of read transactions (requests) the coordinator runs inside the block.

        The background loops (their writes, and reads such as hang detection's every second) run on their
        own clock in threads of their own and are left out: requests run in AnyIO's worker threads.
        """
        with recorded(self.db.engine, threads="AnyIO worker") as statements:
            yield statements

    def statements_for(self, path: str, **params: Any) -> tuple[int, Any]:
        with self.counting() as statements:
            response = self.http.get(path, params=params)
        assert response.status_code == 200, response.text
        return len(statements), response.json()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    settings = coordinator_settings(
        tmp_path / "coordinator", admin_token=ADMIN_TOKEN, telemetry_retention_days=0
    )
    with ExitStack() as stack:
        yield Coordinator.start(stack, settings, admin_token=ADMIN_TOKEN)


def add_agent(session: Any, name: str) -> Agent:
    agent = Agent(
        name=name,
        hostname=name,
        advertise_address="127.0.0.1",
        port_low=21000,
        port_high=21099,
        devices=[{"kind": "cpu", "index": 0, "name": "cpu", "uuid": "", "memory_mib": 0}],
    )
    session.add(agent)
    session.flush()
    return agent


def add_job(
    session: Any,
    agent: Agent,
    n: int,
    *,
    state: str = "SUCCEEDED",
    attempts: int = 1,
    points: list[tuple[int, str, int, float]] = (),  # type: ignore[assignment]
    finished_at: datetime | None = None,
) -> Job:
    """A job written directly: `attempts` attempts of two tasks; points are (attempt, name, step, value)."""
    if session.get(Bundle, DIGEST) is None:
        session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))
    created = datetime(2026, 1, 1) + timedelta(seconds=n)
    job = Job(
        name=f"job-{n}",
        state=state,
        bundle_digest=DIGEST,
        command=["python", "train.py"],
        num_workers=2,
        created_at=created,
        finished_at=finished_at if finished_at else (created if state == "SUCCEEDED" else None),
    )
    session.add(job)
    session.flush()
    chiefs = {}
    for number in range(1, attempts + 1):
        attempt = Attempt(job_id=job.id, number=number, state="SUCCEEDED")
        session.add(attempt)
        session.flush()
        for index in range(2):
            task = Task(
                job_id=job.id,
                attempt_id=attempt.id,
                attempt_number=number,
                index=index,
                agent_id=agent.id,
                host="127.0.0.1",
                port=21000 + index,
                device_kind="cpu",
                device_indices=[0],
                state="SUCCEEDED",
            )
            session.add(task)
            session.flush()
            chiefs.setdefault(number, task)
    for seq, (number, name, step, value) in enumerate(points, start=1):
        session.add(
            MetricPoint(
                job_id=job.id,
                task_id=chiefs[number].id,
                attempt=number,
                seq=seq,
                name=name,
                step=step,
                value=None if math.isnan(value) else value,
                wall_time=utcnow(),
            )
        )
        session.add(
            LogLine(job_id=job.id, task_id=chiefs[number].id, seq=seq, stream="stdout", text="x", at=utcnow())
        )
    session.flush()
    return job


def seed(coordinator: Coordinator, jobs: int) -> None:
    with coordinator.db.write() as session:
        agent = add_agent(session, "volume-agent")
        for n in range(jobs):
            add_job(
                session,
                agent,
                n,
                state="FAILED" if n % 3 == 0 else "SUCCEEDED",
                attempts=1 + n % 3,
                points=[(1, "loss", 1, 0.5), (1 + n % 3, "loss", 7, 0.25), (1 + n % 3, "accuracy", 9, 0.9)],
            )


def test_jobs_list_statements_do_not_grow_with_the_page_size(coordinator: Coordinator) -> None:
    seed(coordinator, 220)
    small, page10 = coordinator.statements_for("/api/v1/jobs", limit=10)
    large, page200 = coordinator.statements_for("/api/v1/jobs", limit=200)
    assert len(page10["jobs"]) == 10 and len(page200["jobs"]) == 200
    assert 0 < small == large, f"{small} statements for 10 rows, {large} for 200"
    filtered_small, _ = coordinator.statements_for("/api/v1/jobs", limit=10, state="FAILED")
    filtered_large, filtered = coordinator.statements_for("/api/v1/jobs", limit=200, state="FAILED", offset=5)
    assert filtered_small == filtered_large
    assert filtered["total"] == 74 and {j["state"] for j in filtered["jobs"]} == {"FAILED"}
    # What each row shows still comes out right: attempts counted, the newest attempt's step and loss.
    newest = page200["jobs"][0]
    assert newest["name"] == "job-219" and page200["total"] == 220
    assert (newest["attempts"], newest["step"], newest["loss"]) == (1, 9, 0.25)
    second = page200["jobs"][1]
    assert (second["name"], second["attempts"], second["step"], second["loss"]) == ("job-218", 3, 9, 0.25)
    assert [j["name"] for j in page10["jobs"]] == [f"job-{n}" for n in range(219, 209, -1)]


def test_progress_in_the_list_follows_the_newest_attempt_that_reported(coordinator: Coordinator) -> None:
    with coordinator.db.write() as session:
        agent = add_agent(session, "progress-agent")
        add_job(session, agent, 1, points=[])
        add_job(session, agent, 2, attempts=2, points=[(1, "loss", 5, 1.5)])  # attempt 2 reported nothing
        add_job(session, agent, 3, points=[(1, "loss", 3, math.nan), (1, "epoch_loss", 40, 1.0)])
        add_job(session, agent, 4, points=[(1, "loss", 3, math.inf), (1, "loss", 3, 2.0), (1, "acc", 8, 0.1)])
    _, page = coordinator.statements_for("/api/v1/jobs")
    shown = {j["name"]: (j["attempts"], j["step"], j["loss"]) for j in page["jobs"]}
    assert shown == {
        "job-1": (1, None, None),
        "job-2": (2, 5, 1.5),
        "job-3": (1, 3, "NaN"),  # epoch_ metrics are not steps; a NaN loss shows as "NaN", not as missing
        "job-4": (1, 8, 2.0),  # the same step twice: the point stored last wins
    }
    job_id = coordinator.http.get("/api/v1/jobs").json()["jobs"][1]["id"]
    detail = coordinator.http.get(f"/api/v1/jobs/{job_id}").json()
    assert (detail["step"], detail["loss"], detail["attempts"]) == (3, "NaN", 1)


def test_job_detail_statements_do_not_grow_with_attempts(coordinator: Coordinator) -> None:
    with coordinator.db.write() as session:
        agent = add_agent(session, "detail-agent")
        few = add_job(session, agent, 1, attempts=1, points=[(1, "loss", 1, 1.0)]).id
        many = add_job(session, agent, 2, attempts=6, points=[(6, "loss", 1, 1.0)]).id
    small, one = coordinator.statements_for(f"/api/v1/jobs/{few}")
    large, six = coordinator.statements_for(f"/api/v1/jobs/{many}")
    assert len(one["attempt_history"]) == 1 and len(six["attempt_history"]) == 6
    assert six["tasks"][0]["agent_name"] == "detail-agent"
    assert small == large, f"{small} statements for 1 attempt, {large} for 6"


@pytest.mark.parametrize("path", ["/api/v1/overview", "/api/v1/agents"])
def test_dashboard_polls_do_not_grow_with_finished_jobs(coordinator: Coordinator, path: str) -> None:
    seed(coordinator, 10)
    before, _ = coordinator.statements_for(path)
    with coordinator.db.write() as session:
        agent = add_agent(session, "more-agent")
        for n in range(100, 200):
            add_job(session, agent, n)
    after, _ = coordinator.statements_for(path)
    assert before == after


def test_retention_deletes_old_telemetry_in_bounded_batches(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'r.db'}")
    upgrade_to_head(db.engine)
    now = utcnow()
    points = [(1, "loss", step, 1.0) for step in range(7)]
    with db.write() as session:
        agent = add_agent(session, "retention-agent")
        old = [
            add_job(session, agent, n, points=points, finished_at=now - timedelta(days=40)).id
            for n in range(5)
        ]
        recent = add_job(session, agent, 10, points=points, finished_at=now - timedelta(days=2)).id
        running = add_job(session, agent, 11, state="RUNNING", points=points).id

    before = cutoff(30, now)
    assert before is not None and cutoff(0, now) is None
    cursor = PurgeCursor()
    batches = 0
    while True:
        with db.write() as session:
            outcome = purge_batch(session, before, cursor, max_rows=4, max_jobs=2)
        assert outcome.log_lines <= 4 and outcome.metric_points <= 4
        batches += 1
        if not outcome.more:
            break
        assert batches < 100
    assert batches > 5  # 35 rows of each table at 4 a batch: the work was split

    with db.read() as session:
        for model in (LogLine, MetricPoint):
            left = dict(
                session.execute(select(model.job_id, func.count()).group_by(model.job_id)).tuples().all()
            )
            assert left == {recent: 7, running: 7}, model.__tablename__
        assert session.scalar(select(func.count()).select_from(Job).where(Job.id.in_(old))) == 5
    with db.write() as session:  # nothing more to do: the cursor is past every old job
        assert purge_batch(session, before, cursor).more is False
    db.dispose()


def test_list_progress_and_retention_on_postgres(postgres_url: str) -> None:  # noqa: F811
    """The page query's correlated subqueries and the batched deletes run on PostgreSQL too."""
    pytest.importorskip("psycopg")
    db = Database(postgres_url)
    upgrade_to_head(db.engine)
    long_ago = utcnow() - timedelta(days=40)
    with db.write() as session:
        agent = add_agent(session, f"pg-volume-{utcnow().timestamp()}")
        ids = [
            add_job(
                session,
                agent,
                n,
                attempts=2,
                points=[(1, "loss", 4, 1.0), (2, "loss", 2, math.nan)],
                finished_at=utcnow(),
            ).id
            for n in range(3)
        ]
        old = add_job(session, agent, 9, points=[(1, "loss", 1, 1.0)], finished_at=long_ago).id
    with db.read() as session:
        rows, total = list_jobs(session, [JobState.SUCCEEDED], 0, 500)
        shown = {r.job.id: (r.attempts, r.progress) for r in rows}
        assert total >= 4 and shown[ids[0]] == (2, (2, "NaN")) and shown[old] == (1, (1, 1.0))
        assert latest_progress(session, read_job(session, ids[1])) == (2, "NaN")
    before = cutoff(30)
    assert before is not None
    cursor = PurgeCursor()
    with db.write() as session:
        while purge_batch(session, before, cursor, max_rows=1).more:
            pass
    with db.read() as session:
        assert (
            session.scalar(select(func.count()).select_from(MetricPoint).where(MetricPoint.job_id == old))
            == 0
        )
        assert session.scalar(select(func.count()).select_from(LogLine).where(LogLine.job_id.in_(ids))) == 6
    db.dispose()
