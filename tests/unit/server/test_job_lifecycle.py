"""Job lifecycle through the services on a real SQLite database: placement, reports, failures, restarts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.job_life.jobs import cancel_job, create_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.states import TaskState

BACKOFF = 1.0


# What the shared `db` fixture (tests/conftest.py) holds.
pytestmark = pytest.mark.db_seed("c" * 64, agents=("a", "b", "c"))


def submit(db: Database, **spec) -> str:
    with db.write() as session:
        job = create_job(
            session, JobCreate(bundle_digest="c" * 64, command=["python", "t.py"], workers=2, **spec)
        )
        schedule_pending(session)
        return job.id


def report(db: Database, job_id: str, index: int, state: TaskState, exit_code: int | None = None) -> Job:
    with db.write() as session:
        job = session.get(Job, job_id)
        task = job.attempts[-1].tasks[index]
        agent = session.get(Agent, task.agent_id)
        apply_report(session, agent, TaskReport(task.id, state, exit_code, ""), backoff_base_s=BACKOFF)
        return job


def run_all(db: Database, job_id: str) -> None:
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)


def state_of(db: Database, job_id: str) -> tuple[str, str]:
    with db.read() as session:
        job = session.get(Job, job_id)
        return job.state, job.reason


def test_happy_path(db):
    job_id = submit(db)
    assert state_of(db, job_id)[0] == "SCHEDULED"
    run_all(db, job_id)
    assert state_of(db, job_id)[0] == "RUNNING"
    report(db, job_id, 0, TaskState.SUCCEEDED, 0)
    assert state_of(db, job_id)[0] == "RUNNING"
    report(db, job_id, 1, TaskState.SUCCEEDED, 0)
    assert state_of(db, job_id)[0] == "SUCCEEDED"


def test_permanent_failure_waits_for_the_gang_then_fails_with_the_cause(db):
    job_id = submit(db)
    run_all(db, job_id)
    report(db, job_id, 1, TaskState.FAILED, 3)
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job.state == "RUNNING"  # decided once the other task has stopped
        assert job.attempts[0].tasks[0].stop_requested
    report(db, job_id, 0, TaskState.STOPPED, 143)
    state, reason = state_of(db, job_id)
    assert state == "FAILED"
    assert reason.startswith("task 1 on agent") and "code 3" in reason and "not retryable" in reason


def test_survivor_exit_1_then_lost_agent_restarts(db):
    job_id = submit(db)
    run_all(db, job_id)
    report(db, job_id, 0, TaskState.FAILED, 1)  # the survivor's collective failed first
    with db.write() as session:
        job = session.get(Job, job_id)
        lost_agent = session.get(Agent, job.attempts[0].tasks[1].agent_id)
        lost_agent.online_until = utcnow() - timedelta(seconds=1)
    with db.write() as session:
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300)
    state, reason = state_of(db, job_id)
    assert state == "RESTARTING", reason
    assert "task 1" in reason and "lost" in reason


def test_signal_is_retryable_and_restart_places_a_new_attempt(db):
    job_id = submit(db)
    run_all(db, job_id)
    report(db, job_id, 1, TaskState.FAILED, 137)
    report(db, job_id, 0, TaskState.STOPPED, 143)
    assert state_of(db, job_id)[0] == "RESTARTING"
    with db.write() as session:
        session.get(Job, job_id).not_before = utcnow() - timedelta(seconds=1)
        schedule_pending(session)
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job.state == "SCHEDULED" and len(job.attempts) == 2 and job.restarts == 1
        assert [t.state for t in job.attempts[1].tasks] == ["ASSIGNED", "ASSIGNED"]


def test_restart_budget_runs_out(db):
    job_id = submit(db, restart={"max_restarts": 0})
    run_all(db, job_id)
    report(db, job_id, 1, TaskState.FAILED, 137)
    report(db, job_id, 0, TaskState.STOPPED, 143)
    state, reason = state_of(db, job_id)
    assert state == "FAILED" and "restarts used" not in reason


def test_restart_on_any_retries_exit_codes_below_128(db):
    job_id = submit(db, restart={"max_restarts": 1, "restart_on": "any"})
    run_all(db, job_id)
    report(db, job_id, 1, TaskState.FAILED, 2)
    report(db, job_id, 0, TaskState.STOPPED, 143)
    assert state_of(db, job_id)[0] == "RESTARTING"


def test_rejected_port_places_the_job_again_without_a_restart(db):
    job_id = submit(db)
    report(db, job_id, 1, TaskState.REJECTED)
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job.state == "PENDING" and job.restarts == 0
        assert job.attempts[0].state == "REPLACED"


def test_cancel_during_backoff(db):
    job_id = submit(db)
    run_all(db, job_id)
    report(db, job_id, 1, TaskState.FAILED, 137)
    report(db, job_id, 0, TaskState.STOPPED, 143)
    with db.write() as session:
        assert cancel_job(session, job_id).state == "CANCELLED"
    with db.write() as session:
        schedule_pending(session)
        assert len(session.get(Job, job_id).attempts) == 1


def test_startup_timeout_fails_the_attempt(db):
    job_id = submit(db, startup_timeout_seconds=5)
    with db.write() as session:
        job = session.get(Job, job_id)
        job.attempts[0].created_at = utcnow() - timedelta(seconds=10)
    with db.write() as session:
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300)
    state, reason = state_of(db, job_id)
    assert state == "RESTARTING" and "did not start within" in reason


def test_resent_reports_change_nothing(db):
    job_id = submit(db)
    run_all(db, job_id)
    run_all(db, job_id)
    report(db, job_id, 0, TaskState.SUCCEEDED, 0)
    report(db, job_id, 0, TaskState.SUCCEEDED, 0)
    with db.read() as session:
        job = session.get(Job, job_id)
        assert [e.to_state for e in job.events] == ["PENDING", "SCHEDULED", "RUNNING"]


def test_a_refused_port_is_not_picked_again_on_that_agent(db):
    job_id = submit(db)
    with db.read() as session:
        refused = session.get(Job, job_id).attempts[0].tasks[1]
        refused_agent, refused_port = refused.agent_id, refused.port
    with db.write() as session:
        agent = session.get(Agent, refused_agent)
        agent.port_low, agent.port_high = refused_port, refused_port + 1  # the refused port and one other
    report(db, job_id, 1, TaskState.REJECTED)
    for _ in range(5):  # random port choice: without the memory, a 1 in 32 chance to miss the refused port
        with db.write() as session:
            schedule_pending(session)
            job = session.get(Job, job_id)
            ports = [(t.agent_id, t.port) for t in job.attempts[-1].tasks]
            assert (refused_agent, refused_port) not in ports
            replaced = job.attempts[-1]
            replaced.state = "REPLACED"
            for task in replaced.tasks:
                task.state = "STOPPED"
            job.state = "PENDING"


def test_out_of_order_report_is_ignored_not_fatal(db):
    job_id = submit(db)  # tasks ASSIGNED
    with db.write() as session:
        task = session.get(Job, job_id).attempts[0].tasks[1]
        session.get(Agent, task.agent_id).online_until = utcnow() - timedelta(seconds=1)
    with db.write() as session:
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300)
    report(db, job_id, 1, TaskState.REJECTED)  # LOST -> REJECTED is not in the table
    with db.read() as session:
        assert session.get(Job, job_id).attempts[0].tasks[1].state == "LOST"


def test_failing_attempt_whose_last_task_exits_0_still_ends(db):
    job_id = submit(db)
    run_all(db, job_id)
    report(db, job_id, 1, TaskState.FAILED, 1)  # permanent: waits for the chief
    report(db, job_id, 0, TaskState.SUCCEEDED, 0)  # the chief finished before its stop arrived
    state, reason = state_of(db, job_id)
    assert state == "FAILED" and reason.startswith("task 1")


def test_agents_refusing_a_job_again_and_again_fail_it(db):
    job_id = submit(db)
    for _ in range(5):
        report(db, job_id, 0, TaskState.REJECTED)
        with db.write() as session:
            for task in session.get(Job, job_id).attempts[-1].tasks:
                if task.state == "ASSIGNED":
                    task.state = "STOPPED"  # the stop the agent would confirm
            schedule_pending(session)
    state, reason = state_of(db, job_id)
    assert state == "FAILED" and "5 times in a row" in reason


def test_lost_tasks_hold_their_devices_until_the_agent_confirms(db):
    from mwms.server.services.fleet.agents import capacities

    job_id = submit(db)
    run_all(db, job_id)
    with db.write() as session:
        lost = session.get(Job, job_id).attempts[0].tasks[1]
        lost_agent = lost.agent_id
        session.get(Agent, lost_agent).online_until = utcnow() - timedelta(seconds=1)
    with db.write() as session:
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300)
        agent = session.get(Agent, lost_agent)
        agent.online_until = utcnow() + timedelta(seconds=30)  # it comes back
        offer = {c.agent_id: c for c in capacities(session)}
        assert offer[lost_agent].free_devices == ()
    report(db, job_id, 1, TaskState.STOPPED, 143)  # the agent confirms it stopped the task
    with db.read() as session:
        offer = {c.agent_id: c for c in capacities(session)}
        assert offer[lost_agent].free_devices == (0,)


def test_only_connected_agents_get_work_when_told(db):
    with db.write() as session:
        ids = [a.id for a in session.query(Agent).order_by(Agent.name)]
        job = create_job(session, JobCreate(bundle_digest="c" * 64, command=["python", "t.py"], workers=2))
        assert schedule_pending(session, connected=frozenset(ids[:1])) == []
        assert sorted(schedule_pending(session, connected=frozenset(ids[:2]))) == sorted(ids[:2])
        assert session.get(Job, job.id).state == "SCHEDULED"


def test_checkpoint_from_an_older_attempt_is_refused(db):
    from mwms.server.errors import Conflict
    from mwms.server.services.storage.files import ensure_current_attempt

    job_id = submit(db)
    run_all(db, job_id)
    report(db, job_id, 1, TaskState.FAILED, 137)
    report(db, job_id, 0, TaskState.STOPPED, 143)
    with db.write() as session:
        session.get(Job, job_id).not_before = utcnow() - timedelta(seconds=1)
        schedule_pending(session)
    with db.read() as session:
        job = session.get(Job, job_id)
        ensure_current_attempt(session, job.attempts[1].tasks[0])
        with pytest.raises(Conflict):
            ensure_current_attempt(session, job.attempts[0].tasks[0])


def test_a_name_held_by_a_connected_agent_on_another_host_is_refused(db):
    from mwms.server.errors import NameTaken

    with db.write() as session:
        holder = session.query(Agent).filter_by(name="a").one()
        clone = Registration(
            "a", "other-host", "127.0.0.2", 20000, 20010, [{"kind": "cpu", "index": 0, "name": "s"}], "t"
        )
        with pytest.raises(NameTaken, match="another --name"):
            register_agent(session, clone, 30, connected=frozenset({holder.id}))
        register_agent(session, clone, 30)  # the holder is gone: the name can move
