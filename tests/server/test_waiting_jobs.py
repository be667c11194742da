"""The scheduler's cache of waiting jobs reads again exactly the jobs that changed, and places as a full
read would."""

from __future__ import annotations

from typing import Any

from coordinator_rows import seeded_database
from sqlalchemy import event

from server.db.models import Job, utcnow
from server.schemas import JobCreate
from server.services.jobs import SubmitPolicy, cancel_job, create_job, set_priority
from server.services.scheduling import SharingPolicy, read_waiting, schedule_pass
from server.services.waiting_jobs import WaitingJobs
from server.states import JobState

DIGEST = "e" * 64


def submit(db, workers=1, **fields) -> str:
    with db.write() as session:
        spec = JobCreate(bundle_digest=DIGEST, command=["python", "x.py"], workers=workers, **fields)
        return create_job(session, spec, submitted_by="u").id


def cached(db, cache: WaitingJobs) -> dict[str, Any]:
    with db.read() as session:
        return {j.job_id: (j.state, j.priority) for j in cache.read(session, utcnow())}


def full(db) -> dict[str, Any]:
    with db.read() as session:
        return {j.job_id: (j.state, j.priority) for j in read_waiting(session, utcnow())}


def test_the_cache_follows_submits_cancels_priority_changes_and_placements(tmp_path):
    db = seeded_database(tmp_path / "w.db", DIGEST, ("a-1",))
    cache = WaitingJobs()
    waiting = [submit(db, workers=2) for _ in range(3)]  # two workers: never fit one slot
    assert cached(db, cache) == full(db) and len(full(db)) == 3
    with db.write() as session:
        cancel_job(session, waiting[0])
        set_priority(session, waiting[1], 800, by="u", policy=SubmitPolicy(), any_owner=True)
    fitting = submit(db)
    assert cached(db, cache) == full(db)
    assert cached(db, cache)[waiting[1]] == ("PENDING", 800) and waiting[0] not in cached(db, cache)

    statements: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    placed = schedule_pass(db, policy=SharingPolicy(), waiting_jobs=cache)
    assert placed and cached(db, cache) == full(db) and fitting not in cached(db, cache)
    with db.read() as session:
        assert session.get(Job, fitting).state == JobState.SCHEDULED.value
    # Jobs that did not change are not read again: the waiting query names the changed ones only.
    statements.clear()
    schedule_pass(db, policy=SharingPolicy(), waiting_jobs=cache)
    reads = [s for s in statements if "FROM jobs" in s and "jobs.num_workers" in s]
    assert reads and all("IN (" in s for s in reads), reads
    db.dispose()
