"""The scheduler's cache of waiting jobs reads again exactly the jobs that changed, and places as a full
read would."""

from __future__ import annotations

from typing import Any

from mwms.server.db.models import Job, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import SubmitPolicy, cancel_job, create_job, set_priority
from mwms.server.services.job_life.transitions import transition_job
from mwms.server.services.scheduler.scheduling import SharingPolicy, read_waiting, schedule_pass
from mwms.server.services.scheduler.waiting_jobs import WaitingJobs
from mwms.server.states import JobState
from mwms_testkit.coordinator_rows import seeded_database
from mwms_testkit.sql_statements import recorded

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

    with recorded(db.engine) as statements:
        placed = schedule_pass(db, policy=SharingPolicy(), waiting_jobs=cache)
        assert placed and cached(db, cache) == full(db) and fitting not in cached(db, cache)
        with db.read() as session:
            assert session.get(Job, fitting).state == JobState.SCHEDULED.value
        # A job that changed is read again by its id; when none did, no waiting job is read at all.
        with db.write() as session:
            set_priority(session, waiting[2], 100, by="u", policy=SubmitPolicy(), any_owner=True)
        statements.clear()
        schedule_pass(db, policy=SharingPolicy(), waiting_jobs=cache)
        reads = [s for s in statements if "FROM jobs" in s and "jobs.num_workers" in s]
        assert len(reads) == 1 and "IN (" in reads[0], reads
        statements.clear()
        schedule_pass(db, policy=SharingPolicy(), waiting_jobs=cache)
        assert [s for s in statements if "FROM jobs" in s and "jobs.num_workers" in s] == []
    assert cached(db, cache) == full(db)
    db.dispose()


def test_a_change_the_events_did_not_show_is_caught_by_the_count_and_priority_check(tmp_path):
    db = seeded_database(tmp_path / "c.db", DIGEST, ())
    cache = WaitingJobs()
    first = submit(db)
    assert set(cached(db, cache)) == {first}
    with db.write() as session:  # as another writer might, without an event
        job = session.get(Job, first)
        assert job is not None
        job.priority = 900
    assert cached(db, cache) == full(db) == {first: ("PENDING", 900)}
    db.dispose()


def test_a_pass_that_decided_nothing_is_not_planned_again_until_something_changes(tmp_path):
    db = seeded_database(tmp_path / "q.db", DIGEST, ("a-1",))
    cache = WaitingJobs()
    first, second = submit(db), submit(db)
    assert schedule_pass(db, waiting_jobs=cache)  # the first job takes the one slot
    schedule_pass(db, waiting_jobs=cache)
    assert cache.quiet_key is not None  # the second waits: nothing changed since, nothing to decide
    assert schedule_pass(db, waiting_jobs=cache) == []
    with db.write() as session:  # the first job ends: its slot is free
        job = session.get(Job, first)
        assert job is not None
        cancel_job(session, first)
        for task in job.attempts[-1].tasks:
            task.state = "STOPPED"
    assert schedule_pass(db, waiting_jobs=cache)
    with db.read() as session:
        assert session.get(Job, second).state == JobState.SCHEDULED.value
    db.dispose()


def test_events_of_jobs_that_do_not_wait_leave_the_waiting_jobs_version_alone(tmp_path):
    """A placed job's events (its tasks starting) change nothing a pass plans the
    waiting jobs with: the version stays, so the next pass is not a full replan of every waiting job."""
    db = seeded_database(tmp_path / "v.db", DIGEST, ("a-1",))
    cache = WaitingJobs()
    placed, waiting = submit(db), submit(db, workers=2)
    assert schedule_pass(db, waiting_jobs=cache)
    cached(db, cache)
    version = cache.version
    with db.write() as session:  # its tasks started: the job runs (an event)
        job = session.get(Job, placed)
        assert job is not None
        transition_job(session, job, JobState.RUNNING, "all tasks running")
    cached(db, cache)
    assert cache.version == version
    with db.write() as session:
        set_priority(session, waiting, 700, by="u", policy=SubmitPolicy(), any_owner=True)
    assert cached(db, cache)[waiting] == ("PENDING", 700)
    assert cache.version != version
    db.dispose()


def test_a_running_job_turning_preemptable_replans_only_when_a_waiting_job_could_preempt_it(tmp_path):
    """The 64-worker job of the scale bench (priority 900, above every waiting job) made the scheduler
    plan 10,000 jobs again as its workers started and it turned preemptable; a job of lower priority than
    one waiting still does."""
    db = seeded_database(tmp_path / "p.db", DIGEST, ("a-1", "a-2"))
    cache = WaitingJobs()
    policy = SharingPolicy(min_runtime_s=0)
    top, low = submit(db, priority=900), submit(db, priority=100)
    assert len(schedule_pass(db, policy=policy, waiting_jobs=cache)) == 2
    submit(db, workers=3, priority=500)  # never fits two slots: waits whatever runs
    schedule_pass(db, policy=policy, waiting_jobs=cache)
    assert cache.quiet_key is not None

    def running(job_id: str) -> None:
        with db.write() as session:
            job = session.get(Job, job_id)
            assert job is not None
            for task in job.attempts[-1].tasks:
                task.state = "RUNNING"
            transition_job(session, job, JobState.RUNNING, "all tasks running")

    def planned() -> bool:
        phases: dict[str, float] = {}
        schedule_pass(db, policy=policy, waiting_jobs=cache, phases=phases)
        return "order" in phases

    running(top)
    assert not planned()  # nothing waiting may preempt a priority-900 job
    running(low)
    assert planned()  # the priority-500 job may preempt it now
    assert not planned()
    db.dispose()
