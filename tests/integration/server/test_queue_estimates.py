"""Estimated starts from what is known (issue 33): the run history read in one bounded query
(server/services/job_life/run_history.py), and `GET /api/v1/queue` of a real coordinator (SQLite, its loops running)
estimating a waiting job's start from a running job without a max_runtime and its user's finished jobs of
the same shape, or saying "unknown" when there are none."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from mwms.server.db.engine import Database
from mwms.server.db.models import Job
from mwms.server.services.job_life import run_history
from mwms.server.services.job_life.run_history import typical_run_times
from mwms_testkit.coordinator_rows import place_task
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

JOIN_TOKEN = "join-token-for-queue-estimate-tests-0123456"
ADMIN_TOKEN = "mwms_admin-token-for-queue-estimate-tests-0"
DIGEST = hashlib.sha256(b"estimates").hexdigest()
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


def finished_job(
    session: Session,
    user: str,
    run_s: float,
    *,
    workers: int = 1,
    gpus: int = 0,
    ended_ago_s: float = 3600,
    state: str = "SUCCEEDED",
    now: datetime = NOW,
) -> None:
    """A job of `user`'s that ran `run_s` seconds from its start to its end, `ended_ago_s` before `now`."""
    finished = now - timedelta(seconds=ended_ago_s)
    started = finished - timedelta(seconds=run_s)
    session.add(
        Job(
            name="done",
            state=state,
            bundle_digest=DIGEST,
            command=["python", "train.py"],
            num_workers=workers,
            gpus_per_worker=gpus,
            submitted_by=user,
            created_at=started - timedelta(seconds=5),
            started_at=started,
            finished_at=finished,
        )
    )


# -- the run history -------------------------------------------------------------------------------------


@pytest.mark.db_seed(DIGEST)
def test_typical_run_times_are_medians_per_user_and_shape(db: Database) -> None:
    with db.write() as session:
        for minutes in (8, 10, 12):
            finished_job(session, "bob", minutes * 60)
        finished_job(session, "bob", 3600, workers=2, gpus=1)
        finished_job(session, "bob", 60, state="FAILED")  # a failure says nothing of how long a run takes
        finished_job(session, "carol", 120)
    with db.read() as session:
        assert typical_run_times(session, ["bob"]) == {("bob", 1, 0): 600.0, ("bob", 2, 1): 3600.0}
        assert typical_run_times(session, ["bob", "carol", "nobody"])[("carol", 1, 0)] == 120.0
        assert typical_run_times(session, []) == {}


@pytest.mark.db_seed(DIGEST)
def test_only_the_newest_runs_count_and_the_scan_is_bounded(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.write() as session:
        for i in range(run_history.PER_SHAPE):  # the newest: 10 min each
            finished_job(session, "bob", 600, ended_ago_s=60 * (i + 1))
        for i in range(run_history.PER_SHAPE + 5):  # older and slower: beyond the cap
            finished_job(session, "bob", 7200, ended_ago_s=86_400 + 60 * i)
        finished_job(session, "carol", 300, ended_ago_s=30 * 86_400)  # long ago
    with db.read() as session:
        assert typical_run_times(session, ["bob", "carol"]) == {("bob", 1, 0): 600.0, ("carol", 1, 0): 300.0}
    # However many jobs the table holds, only the most recent SCAN_LIMIT successes are read.
    monkeypatch.setattr(run_history, "SCAN_LIMIT", run_history.PER_SHAPE)
    with db.read() as session:
        assert typical_run_times(session, ["bob", "carol"]) == {("bob", 1, 0): 600.0}


# -- through the API -------------------------------------------------------------------------------------


class Coordinator(InProcessCoordinator):
    """With two one-slot CPU agents registered and a bundle stored."""

    agent_ids: list[str]

    def setup(self) -> None:
        self.agent_ids = [
            self.register_agent(name, JOIN_TOKEN, port) for name, port in (("box-1", 20000), ("box-2", 21000))
        ]

    def queue_entry(self, job_id: str) -> dict[str, Any]:
        page = self.http.get("/api/v1/queue", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert page.status_code == 200, page.text
        return next(entry for entry in page.json()["jobs"] if entry["job_id"] == job_id)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    settings = coordinator_settings(
        tmp_path / "coordinator",
        join_token=JOIN_TOKEN,
        admin_token=ADMIN_TOKEN,
        agent_timeout_s=300,
        view_cache_s=0,  # each GET reads the database again
    )
    with ExitStack() as stack:
        coordinator = Coordinator.start(stack, settings)
        coordinator.setup()
        yield coordinator


def test_the_queue_estimates_a_start_from_similar_jobs_and_says_unknown_without_them(
    coordinator: Coordinator,
) -> None:
    # bob's job holds one of the two slots, with no max_runtime; it started 4 minutes ago.
    started = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=4)
    running = place_task(coordinator.db, coordinator.agent_ids[0], digest=DIGEST).job_id
    with coordinator.db.write() as session:
        session.execute(update(Job).where(Job.id == running).values(submitted_by="bob", started_at=started))
    # alice's job needs both slots: it waits for bob's.
    body = {"name": "both", "bundle_digest": DIGEST, "command": ["python", "t.py"], "workers": 2}
    submitted = coordinator.http.post("/api/v1/jobs", json=body, headers=coordinator.auth("alice"))
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]

    entry = coordinator.queue_entry(job_id)
    assert entry["estimated_start"] is None and entry["estimate_basis"] == "unknown", entry

    # bob's 1-worker CPU jobs ran 8, 10 and 12 minutes (and a 2-worker one an hour: another shape).
    with coordinator.db.write() as session:
        for minutes in (8, 10, 12):
            finished_job(session, "bob", minutes * 60, now=started)
        finished_job(session, "bob", 3600, workers=2, now=started)
    entry = coordinator.queue_entry(job_id)
    assert entry["estimate_basis"] == "similar_jobs", entry
    assert datetime.fromisoformat(entry["estimated_start"]) == started + timedelta(minutes=10)
    # The scheduler's reservation still counts max_runtime only: it does not know when bob's job ends.
    assert entry["waiting"].get("estimated_start") is None


def test_the_queue_rows_estimate_is_in_the_openapi_schema(coordinator: Coordinator) -> None:
    schema = coordinator.app.openapi()["components"]["schemas"]["QueueEntry"]
    assert schema["properties"]["estimate_basis"]["enum"] == [
        "max_runtime",
        "similar_jobs",
        "overdue",
        "unknown",
    ]
    assert "estimated_start" in schema["properties"]
