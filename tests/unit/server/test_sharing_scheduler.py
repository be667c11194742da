"""Sharing on a real database: a preemption from decision to resumed victim, cordons, safety settings."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from sqlalchemy import select

from mwms.server.db.models import Agent, Job, Preemption, Task, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler.scheduling import SharingPolicy, schedule_pending
from mwms.server.states import JobState, TaskState
from mwms.task_environment import PREEMPTED_AND_SAVED_EXIT_CODE
from mwms_testkit.coordinator_rows import seeded_database

DIGEST = "c" * 64
NOW_POLICY = SharingPolicy(grace_s=15, min_runtime_s=0, max_preemptions_per_hour=4)


def submit(db, workers=1, **fields) -> str:
    with db.write() as session:
        spec = JobCreate(bundle_digest=DIGEST, command=["python", "train.py"], workers=workers, **fields)
        return create_job(session, spec, submitted_by="u").id


def schedule(db, policy=NOW_POLICY) -> None:
    with db.write() as session:
        schedule_pending(session, policy=policy)


def report(db, job_id: str, state: TaskState, exit_code: int | None = None, only: int | None = None) -> None:
    with db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        for task in job.attempts[-1].tasks:
            if only is not None and task.index != only:
                continue
            agent = session.get(Agent, task.agent_id)
            assert agent is not None
            apply_report(session, agent, TaskReport(task.id, state, exit_code), backoff_base_s=1)


def job_row(db, job_id: str) -> Job:
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
        return job


def devices_in_use(db) -> Counter:
    live = [s.value for s in TaskState if not s.terminal]
    with db.read() as session:
        tasks = session.scalars(select(Task).where(Task.state.in_(live))).all()
        return Counter((t.agent_id, i) for t in tasks for i in t.device_indices)


def test_a_preemption_stops_the_whole_gang_holds_its_slots_and_requeues_it_once_in_its_place(tmp_path):
    db = seeded_database(tmp_path / "p.db", DIGEST, ("a-1", "a-2"))
    low = submit(db, workers=2, priority=100, preemption_grace_seconds=20)
    schedule(db)
    report(db, low, TaskState.RUNNING)
    assert job_row(db, low).state == JobState.RUNNING.value

    urgent = submit(db, workers=2, priority=900)
    schedule(db)
    victim = job_row(db, low)
    assert victim.state == JobState.PREEMPTING.value and f"job {urgent}" in victim.reason
    with db.read() as session:
        tasks = session.scalars(select(Task).where(Task.job_id == low)).all()
        # Every worker of the gang is asked to stop at once, with the job's own grace.
        assert [(t.stop_requested, t.stop_grace_s) for t in tasks] == [(True, 20), (True, 20)]
        assert session.scalars(select(Preemption)).one().cause == "priority"
    held = job_row(db, urgent)
    assert held.state == JobState.PENDING.value and held.waiting["kind"] == "preempting"
    assert sorted(held.hold or {}) == sorted(t.agent_id for t in tasks)

    # One victim has exited; a small job submitted now must not slip into its slot.
    sneaky = submit(db, priority=100)
    report(db, low, TaskState.STOPPED, PREEMPTED_AND_SAVED_EXIT_CODE, only=0)
    schedule(db)
    assert job_row(db, sneaky).state == JobState.PENDING.value
    assert job_row(db, sneaky).waiting["kind"] == "behind_priority"
    assert job_row(db, urgent).state == JobState.PENDING.value

    report(db, low, TaskState.STOPPED, PREEMPTED_AND_SAVED_EXIT_CODE, only=1)
    schedule(db)
    victim, winner = job_row(db, low), job_row(db, urgent)
    assert winner.state == JobState.SCHEDULED.value and winner.hold is None
    assert victim.state == JobState.PENDING.value and victim.restarts == 0
    with db.read() as session:
        record = session.scalars(select(Preemption)).one()
        assert record.saved is True and record.ended_at is not None
        history = session.get(Job, low).events
        events = [e.to_state for e in history]
        reasons = " ".join(e.reason for e in history)
    # Requeued exactly once, and the preempted attempt is told apart from a failure.
    assert events.count(JobState.PREEMPTING.value) == 1 and JobState.FAILED.value not in events
    assert "every worker saved a checkpoint" in reasons
    assert max(devices_in_use(db).values()) == 1  # never a device twice

    # The victim keeps its place: it is older than "sneaky", same priority, so it goes first.
    report(db, urgent, TaskState.RUNNING)
    report(db, urgent, TaskState.SUCCEEDED, 0)
    schedule(db)
    assert job_row(db, low).state == JobState.SCHEDULED.value
    assert job_row(db, sneaky).state == JobState.PENDING.value
    db.dispose()


def test_minimum_run_time_and_the_hourly_cap_protect_running_jobs(tmp_path):
    db = seeded_database(tmp_path / "s.db", DIGEST, ("a-1",))
    low = submit(db, priority=100)
    schedule(db)
    report(db, low, TaskState.RUNNING)
    submit(db, priority=900)
    schedule(db, SharingPolicy(grace_s=15, min_runtime_s=3600, max_preemptions_per_hour=4))
    assert job_row(db, low).state == JobState.RUNNING.value
    schedule(db, SharingPolicy(grace_s=15, min_runtime_s=0, max_preemptions_per_hour=0))
    assert job_row(db, low).state == JobState.RUNNING.value
    schedule(db)
    assert job_row(db, low).state == JobState.PREEMPTING.value
    db.dispose()


def test_unpreemptible_jobs_are_never_victims(tmp_path):
    db = seeded_database(tmp_path / "u.db", DIGEST, ("a-1",))
    fixed = submit(db, priority=100, preemptible=False)
    schedule(db)
    report(db, fixed, TaskState.RUNNING)
    urgent = submit(db, priority=900)
    schedule(db)
    assert job_row(db, fixed).state == JobState.RUNNING.value
    assert job_row(db, urgent).waiting["kind"] == "head"
    db.dispose()


def test_cordoned_agents_get_no_new_tasks(tmp_path):
    db = seeded_database(tmp_path / "c.db", DIGEST, ("a-1", "a-2"))
    with db.write() as session:
        agent = session.scalars(select(Agent).where(Agent.name == "a-1")).one()
        agent.cordoned_at, agent.cordoned_by = utcnow(), "admin"
    first, second = submit(db), submit(db)
    schedule(db)
    with db.read() as session:
        placed = session.scalars(select(Task)).all()
        cordoned = session.scalars(select(Agent.id).where(Agent.name == "a-1")).one()
    assert len(placed) == 1 and placed[0].agent_id != cordoned
    assert job_row(db, second).waiting["kind"] in ("cordoned", "head")
    assert {job_row(db, first).state, job_row(db, second).state} == {"SCHEDULED", "PENDING"}
    db.dispose()


def test_time_spent_preempted_does_not_count_against_max_runtime(tmp_path):
    db = seeded_database(tmp_path / "r.db", DIGEST, ("a-1",))
    low = submit(db, priority=100, max_runtime_seconds=100)
    schedule(db)
    report(db, low, TaskState.RUNNING)
    urgent = submit(db, priority=900)
    schedule(db)
    report(db, low, TaskState.STOPPED, PREEMPTED_AND_SAVED_EXIT_CODE)
    schedule(db)  # the victim waits again; the urgent job runs
    # As if it had started, and been preempted, 150 s ago.
    with db.write() as session:
        job = session.get(Job, low)
        assert job is not None and job.started_at is not None and job.state == JobState.PENDING.value
        job.started_at -= timedelta(seconds=150)
        job.attempts[-1].ended_at -= timedelta(seconds=150)
    with db.write() as session:
        reconcile(session, backoff_base_s=1, default_startup_timeout_s=300)
    assert job_row(db, low).state == JobState.PENDING.value  # 150 s since it started, but it ran ~0 s
    # Placed again after the urgent job: its run time goes on from what it had used.
    report(db, urgent, TaskState.RUNNING)
    report(db, urgent, TaskState.SUCCEEDED, 0)
    schedule(db)
    assert job_row(db, low).state == JobState.SCHEDULED.value
    assert job_row(db, low).options["preempted_s"] >= 150
    with db.write() as session:
        reconcile(
            session, backoff_base_s=1, default_startup_timeout_s=300, now=utcnow() + timedelta(seconds=20)
        )
    assert job_row(db, low).state == JobState.SCHEDULED.value
    with db.write() as session:  # as if it had now run 100 s besides its wait
        job = session.get(Job, low)
        assert job is not None and job.started_at is not None
        job.started_at -= timedelta(seconds=100)
    with db.write() as session:
        reconcile(session, backoff_base_s=1, default_startup_timeout_s=300)
    assert job_row(db, low).state == JobState.FAILED.value
    db.dispose()


def test_a_victim_killed_after_its_grace_is_requeued_as_not_saved_without_using_a_restart(tmp_path):
    db = seeded_database(tmp_path / "k.db", DIGEST, ("a-1",))
    low = submit(db, priority=100, restart={"max_restarts": 0})
    schedule(db)
    report(db, low, TaskState.RUNNING)
    submit(db, priority=900)
    schedule(db)
    report(db, low, TaskState.FAILED, -9)  # ignored SIGTERM, SIGKILLed after the grace
    schedule(db)
    victim = job_row(db, low)
    # Not FAILED although it had no restart left: a preemption is not a failure.
    assert victim.state == JobState.PENDING.value and victim.restarts == 0
    with db.read() as session:
        assert session.scalars(select(Preemption)).one().saved is False
        events = session.get(Job, low).events
        assert (
            events[-1].to_state == JobState.PENDING.value and "resumes from its last one" in events[-1].reason
        )
    db.dispose()


def test_a_waiting_job_whose_options_are_not_json_does_not_stall_the_others(tmp_path):
    db = seeded_database(tmp_path / "j.db", DIGEST, ("a-1", "a-2"))
    damaged, fine = submit(db, max_runtime_seconds=60), submit(db, max_runtime_seconds=60)
    with db.write() as session:
        session.connection().exec_driver_sql("UPDATE jobs SET options = '{not json' WHERE id = ?", (damaged,))
    schedule(db)
    assert job_row(db, fine).state == JobState.SCHEDULED.value
    report(db, fine, TaskState.RUNNING)
    schedule(db)  # a running job's damaged options must not stall the pass either
    with db.write() as session:
        session.connection().exec_driver_sql("UPDATE jobs SET options = '[' WHERE id = ?", (fine,))
    third = submit(db)
    schedule(db)
    assert JobState(job_row(db, third).state) in (JobState.SCHEDULED, JobState.PENDING)
    db.dispose()
