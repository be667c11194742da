"""Attempt states change only through transition_attempt: each change leaves an attempt event, and a
change the table refuses raises. Runs the services on a real SQLite database."""

from __future__ import annotations

import pytest
from sqlalchemy import event, select

from mwms.server.api.views import job_out
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Attempt, AttemptEvent, Job, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import cancel_job, create_job
from mwms.server.services.job_life.lifecycle import end_job, restart_policy_value
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.job_life.transitions import transition_attempt
from mwms.server.services.scheduler.scheduling import release_waiting, schedule_pending
from mwms.server.services.views import read_job_view
from mwms.server.states import AttemptState, InvalidTransition, JobState, TaskState

BACKOFF = 0.0


# What the shared `db` fixture (tests/conftest.py) holds.
pytestmark = pytest.mark.db_seed("d" * 64, agents=("a", "b", "c"))


def submit(db: Database, **spec) -> str:
    with db.write() as session:
        spec = {"workers": 2, **spec}
        job = create_job(session, JobCreate(bundle_digest="d" * 64, command=["python", "t.py"], **spec))
        schedule_pending(session)
        return job.id


def report(
    db: Database, job_id: str, index: int, state: TaskState, exit_code: int | None = None, message: str = ""
) -> None:
    with db.write() as session:
        job = session.get(Job, job_id)
        task = job.attempts[-1].tasks[index]
        agent = session.get(Agent, task.agent_id)
        apply_report(session, agent, TaskReport(task.id, state, exit_code, message), backoff_base_s=BACKOFF)


def attempt_events(db: Database, job_id: str) -> list[tuple[int, str | None, str, str]]:
    """(attempt number, from, to, reason) for every attempt event of the job, in order."""
    with db.read() as session:
        rows = session.execute(
            select(Attempt.number, AttemptEvent.from_state, AttemptEvent.to_state, AttemptEvent.reason)
            .join(Attempt, Attempt.id == AttemptEvent.attempt_id)
            .where(Attempt.job_id == job_id)
            .order_by(AttemptEvent.id)
        ).all()
        return [tuple(row) for row in rows]  # type: ignore[misc]


def transitions(db: Database, job_id: str) -> list[tuple[int, str | None, str]]:
    return [(number, old, new) for number, old, new, _ in attempt_events(db, job_id)]


def test_a_placed_attempt_is_born_active_with_an_event(db):
    job_id = submit(db)
    assert transitions(db, job_id) == [(1, None, "ACTIVE")]
    with db.read() as session:
        attempt = session.get(Job, job_id).attempts[0]
        assert attempt.state == "ACTIVE" and attempt.reason == "" and attempt.ended_at is None


def test_success_leaves_a_succeeded_event(db):
    job_id = submit(db)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    for index in (0, 1):
        report(db, job_id, index, TaskState.SUCCEEDED, 0)
    events = attempt_events(db, job_id)
    assert [e[:3] for e in events] == [(1, None, "ACTIVE"), (1, "ACTIVE", "SUCCEEDED")]
    assert events[-1][3] == "every task exited 0"
    with db.read() as session:
        attempt = session.get(Job, job_id).attempts[0]
        assert attempt.reason == "every task exited 0" and attempt.ended_at is not None


def test_a_restart_fails_one_attempt_and_opens_the_next(db):
    job_id = submit(db)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    report(db, job_id, 1, TaskState.FAILED, 137)
    report(db, job_id, 0, TaskState.STOPPED, 143)
    with db.write() as session:
        schedule_pending(session)
    events = attempt_events(db, job_id)
    assert [e[:3] for e in events] == [
        (1, None, "ACTIVE"),
        (1, "ACTIVE", "FAILED"),
        (2, None, "ACTIVE"),
    ]
    assert "exited with code 137" in events[1][3]


def test_a_restart_waits_for_every_older_task_asking_the_database_not_the_attempts(db):
    job_id = submit(db, restart={"max_restarts": 100})
    for round_ in range(6):  # five failed attempts, then a sixth whose worker 1 is slow to stop
        for index in (0, 1):
            report(db, job_id, index, TaskState.RUNNING)
        report(db, job_id, 0, TaskState.FAILED, 137)
        if round_ < 5:
            report(db, job_id, 1, TaskState.STOPPED, 143)
            with db.write() as session:
                schedule_pending(session)
    loaded: list[object] = []
    with db.write() as session:
        event.listen(session, "loaded_as_persistent", lambda _, instance: loaded.append(instance))
        release_waiting(session, utcnow())
        assert session.get(Job, job_id).state == "RESTARTING"  # attempt 6's worker 1 is still stopping
    # Only the job: one restarted a thousand times has a thousand attempts' tasks.
    assert [type(o).__name__ for o in loaded] == ["Job"]
    report(db, job_id, 1, TaskState.STOPPED, 143)
    with db.write() as session:
        release_waiting(session, utcnow())
        job = session.get(Job, job_id)
        assert job.state == "PENDING" and job.events[-1].reason == "placing attempt 7"


def test_a_refused_task_replaces_the_attempt(db):
    job_id = submit(db)
    report(db, job_id, 1, TaskState.REJECTED, message="port busy")
    assert attempt_events(db, job_id)[-1][3].endswith("could not start task 1: port busy")
    assert transitions(db, job_id) == [(1, None, "ACTIVE"), (1, "ACTIVE", "REPLACED")]


def test_cancel_leaves_a_cancelled_event(db):
    job_id = submit(db)
    with db.write() as session:
        cancel_job(session, job_id)
    assert transitions(db, job_id) == [(1, None, "ACTIVE"), (1, "ACTIVE", "CANCELLED")]


def test_ending_a_job_keeps_an_attempt_that_already_ended(db):
    """end_job checks the attempt itself: an ended attempt keeps its ending and gets no new event."""
    job_id = submit(db)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    report(db, job_id, 1, TaskState.FAILED, 137)  # attempt FAILED, job RESTARTING, task 0 still stopping
    with db.write() as session:
        end_job(session, session.get(Job, job_id), JobState.CANCELLED, "cancelled by user")
    assert transitions(db, job_id) == [(1, None, "ACTIVE"), (1, "ACTIVE", "FAILED")]
    with db.read() as session:
        assert session.get(Job, job_id).state == "CANCELLED"


def test_a_refused_attempt_change_raises_and_records_nothing(db):
    job_id = submit(db)
    with db.write() as session:
        cancel_job(session, job_id)
    with db.write() as session:
        attempt = session.get(Job, job_id).attempts[0]
        with pytest.raises(InvalidTransition, match="attempt cannot go from CANCELLED to FAILED"):
            transition_attempt(session, attempt, AttemptState.FAILED, "too late")
        with pytest.raises(InvalidTransition, match="attempt cannot go from CANCELLED to ACTIVE"):
            transition_attempt(session, attempt, AttemptState.ACTIVE)
        assert attempt.state == "CANCELLED"
    assert transitions(db, job_id) == [(1, None, "ACTIVE"), (1, "ACTIVE", "CANCELLED")]


def test_policy_defaults_come_from_restart_policy(db):
    job_id = submit(db)
    with db.write() as session:
        job = session.get(Job, job_id)
        job.options = {**job.options, "restart": {}}  # a row stored without a policy
        assert restart_policy_value(job, "max_restarts") == 3
        assert restart_policy_value(job, "restart_on") == "retryable"
        assert restart_policy_value(job, "fail_on_nan") == []


def test_the_worker_that_failed_is_named_and_its_peers_are_stopped_because_of_it(db):
    job_id = submit(db)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    report(db, job_id, 1, TaskState.FAILED, 1, "exited with code 1")
    with db.read() as session:
        peer = session.get(Job, job_id).attempts[0].tasks[0]
        assert peer.stop_requested and peer.stop_reason == "stopped because worker 1 failed"
    # The peer's collective fails too, as it is being stopped: its agent reports the stop's reason.
    report(db, job_id, 0, TaskState.STOPPED, 1, peer.stop_reason)
    with db.read() as session:
        job = job_out(read_job_view(session, job_id))
    assert job.state == "FAILED"
    assert [(t.index, t.state, t.exit_code, t.ended_attempt) for t in job.tasks] == [
        (0, "STOPPED", 1, False),
        (1, "FAILED", 1, True),
    ]
    assert job.tasks[0].message == "stopped because worker 1 failed"
    assert [t.ended_attempt for t in job.attempt_history[0].tasks] == [False, True]


def test_a_peer_that_exits_0_after_a_failure_still_settles_the_attempt(db):
    """The last task of a failing attempt may end with 0 before its stop arrives: the attempt fails then,
    from the task that failed (lifecycle asks for a failed task before settling, not for every task)."""
    job_id = submit(db)  # exit code 1 is not retried by default
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    report(db, job_id, 1, TaskState.FAILED, 1, "exited with code 1")
    report(db, job_id, 0, TaskState.SUCCEEDED, 0)
    with db.read() as session:
        job = job_out(read_job_view(session, job_id))
    assert job.state == "FAILED"
    assert [(t.index, t.state, t.ended_attempt) for t in job.tasks] == [
        (0, "SUCCEEDED", False),
        (1, "FAILED", True),
    ]


def test_a_gang_runs_and_succeeds_only_once_every_task_has(db):
    job_id = submit(db, workers=3)
    states = []
    for index in (0, 1, 2):
        report(db, job_id, index, TaskState.RUNNING)
        with db.read() as session:
            states.append(session.get(Job, job_id).state)
    for index in (2, 0, 1):
        report(db, job_id, index, TaskState.SUCCEEDED, 0)
        with db.read() as session:
            states.append(session.get(Job, job_id).state)
    assert states == ["SCHEDULED", "SCHEDULED", "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"]
