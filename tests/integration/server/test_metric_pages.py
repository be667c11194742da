"""A job's metrics in pages: a long job's 1,000,000 stored points never come back in one answer, and a page
that polls reads only what was stored after its cursor. A real SQLite database and app."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Attempt, Job, Task, utcnow
from mwms.server.services.observing.telemetry import MAX_METRIC_POINTS_PER_PAGE
from mwms.server.settings import Settings

DIGEST = "5" * 64
ADMIN_TOKEN = "mwms_admin-token-for-metric-page-tests-0"
STORED = 1_000_000
pytestmark = pytest.mark.db_seed(DIGEST, agents=("a",))


@pytest.fixture
def api(db: Database, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        data_dir=tmp_path / "coordinator", grpc_port=0, admin_token=ADMIN_TOKEN, db_url=str(db.engine.url)
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        yield client


def long_job(db: Database, points: int) -> tuple[str, str]:
    """A running one-worker job whose chief stored `points` points (loss and accuracy per step)."""
    with db.write() as session:
        job = Job(name="long", state="RUNNING", bundle_digest=DIGEST, command=["x"], num_workers=1)
        session.add(job)
        session.flush()
        attempt = Attempt(job_id=job.id, number=1, state="ACTIVE")
        session.add(attempt)
        session.flush()
        agent_id = session.scalars(select(Agent.id)).one()
        task = Task(
            job_id=job.id,
            attempt_id=attempt.id,
            attempt_number=1,
            index=0,
            agent_id=agent_id,
            host="127.0.0.1",
            port=20000,
            device_kind="cpu",
            device_indices=[0],
            state="RUNNING",
        )
        session.add(task)
        session.flush()
        job_id, task_id = job.id, task.id
    add_points(db, job_id, task_id, 0, points)
    return job_id, task_id


def add_points(db: Database, job_id: str, task_id: str, first: int, count: int) -> None:
    """Points first..first+count-1 (seq order), stored in one statement through the driver: fast enough
    for a million rows."""
    wall = (utcnow() - timedelta(hours=1)).isoformat(sep=" ")
    rows = [
        (job_id, task_id, 1, seq + 1, "loss" if seq % 2 == 0 else "accuracy", seq // 2, 1.0 / (seq + 1), wall)
        for seq in range(first, first + count)
    ]
    with db.engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO metric_points (job_id, task_id, attempt, seq, name, step, value, wall_time) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )


def test_a_million_points_come_in_bounded_pages_and_a_poll_reads_only_new_ones(db: Database, api) -> None:
    job_id, task_id = long_job(db, STORED)

    first = api.get(f"/api/v1/jobs/{job_id}/metrics")
    assert first.status_code == 200
    body = first.json()
    assert len(body["points"]) == MAX_METRIC_POINTS_PER_PAGE and body["more"] is True
    assert body["cursor"] == 0  # ordered by name: read on from the start, in storage order
    assert len(first.content) < 2_000_000  # bounded, whatever the job stored

    page = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"after": 0, "limit": 1000}).json()
    assert [(p["name"], p["step"]) for p in page["points"][:3]] == [("loss", 0), ("accuracy", 0), ("loss", 1)]
    assert page["more"] is True and page["cursor"] > 0

    # The page has caught up: a poll after the newest point answers nothing, then only what came since.
    newest = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"after": 0, "limit": 1}).json()["cursor"]
    newest += STORED - 1
    idle = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"after": newest}).json()
    assert (idle["points"], idle["more"], idle["cursor"]) == ([], False, newest)
    add_points(db, job_id, task_id, STORED, 4)
    fresh = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"after": newest}).json()
    assert [(p["name"], p["step"]) for p in fresh["points"]] == [
        ("loss", STORED // 2),
        ("accuracy", STORED // 2),
        ("loss", STORED // 2 + 1),
        ("accuracy", STORED // 2 + 1),
    ]
    assert (fresh["more"], fresh["cursor"]) == (False, newest + 4)

    refused = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"limit": MAX_METRIC_POINTS_PER_PAGE + 1})
    assert refused.status_code == 422


def test_a_short_series_comes_whole_with_a_cursor_to_poll_from(db: Database, api) -> None:
    job_id, task_id = long_job(db, 6)
    body = api.get(f"/api/v1/jobs/{job_id}/metrics").json()
    assert [(p["name"], p["step"]) for p in body["points"]] == [
        ("accuracy", 0),
        ("accuracy", 1),
        ("accuracy", 2),
        ("loss", 0),
        ("loss", 1),
        ("loss", 2),
    ]
    assert body["more"] is False
    add_points(db, job_id, task_id, 6, 2)
    fresh = api.get(f"/api/v1/jobs/{job_id}/metrics", params={"after": body["cursor"]}).json()
    assert [(p["name"], p["step"]) for p in fresh["points"]] == [("loss", 3), ("accuracy", 3)]
