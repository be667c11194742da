"""The INFO lines operators alert on (server/observability/event_log.py), written by the single writers on a
real SQLite database: job and attempt states, restarts with their cause, preemptions, agents lost, back and
removed; each with its ids as fields, and only once its transaction commits."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from sqlalchemy import select

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import Registration, record_heartbeats, register_agent, remove_agent
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.lifecycle import preempt_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.states import TaskState

BACKOFF = 1.0
pytestmark = pytest.mark.db_seed("e" * 64, agents=("a", "b"))


@pytest.fixture
def events(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """caplog, holding the records of mwms.server.events at INFO."""
    caplog.set_level(logging.INFO, logger="mwms.server.events")
    return caplog


def of(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    """The fields of each `event` record logged so far in the test."""
    return [
        dict(vars(r))
        for r in caplog.records
        if r.name == "mwms.server.events" and vars(r).get("event") == event
    ]


def submit(db: Database, **spec: object) -> str:
    with db.write() as session:
        job = create_job(
            session, JobCreate(bundle_digest="e" * 64, command=["python", "t.py"], workers=2, **spec)
        )
        schedule_pending(session)
        return job.id


def report(db: Database, job_id: str, index: int, state: TaskState, exit_code: int | None = None) -> None:
    with db.write() as session:
        job = session.get(Job, job_id)
        task = job.attempts[-1].tasks[index]
        agent = session.get(Agent, task.agent_id)
        apply_report(session, agent, TaskReport(task.id, state, exit_code, ""), backoff_base_s=BACKOFF)


def agent_of_task(db: Database, job_id: str, index: int) -> tuple[str, str]:
    with db.read() as session:
        agent = session.get(Agent, session.get(Job, job_id).attempts[-1].tasks[index].agent_id)
        return agent.id, agent.name


def test_every_job_and_attempt_state_is_logged_with_its_ids(db, events):
    job_id = submit(db)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    for index in (0, 1):
        report(db, job_id, index, TaskState.SUCCEEDED, 0)

    jobs = of(events, "job_state")
    assert [(e["job_id"], e["from_state"], e["state"]) for e in jobs] == [
        (job_id, None, "PENDING"),
        (job_id, "PENDING", "SCHEDULED"),
        (job_id, "SCHEDULED", "RUNNING"),
        (job_id, "RUNNING", "SUCCEEDED"),
    ]
    assert jobs[-1]["reason"] == "every task exited 0"
    assert jobs[-1]["levelname"] == "INFO"
    attempts = of(events, "attempt_state")
    assert [(e["job_id"], e["attempt"], e["state"]) for e in attempts] == [
        (job_id, 1, "ACTIVE"),
        (job_id, 1, "SUCCEEDED"),
    ]
    assert events.records[-1].getMessage() == f"job {job_id}: RUNNING -> SUCCEEDED: every task exited 0"


def test_a_decision_that_rolls_back_logs_nothing(db, events):
    with pytest.raises(RuntimeError), db.write() as session:
        create_job(session, JobCreate(bundle_digest="e" * 64, command=["python", "t.py"], workers=1))
        raise RuntimeError("the request failed after the job was made")

    assert of(events, "job_state") == []


def test_a_restart_names_its_cause_and_a_failure_reason_leaves_the_programs_output_out(db, events):
    job_id = submit(db)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    report(db, job_id, 1, TaskState.FAILED, 137)

    (restart,) = of(events, "job_restart")
    assert (restart["job_id"], restart["attempt"], restart["cause"], restart["restart"]) == (
        job_id,
        1,
        "signal",
        1,
    )
    failed = [e for e in of(events, "attempt_state") if e["state"] == "FAILED"]
    assert len(failed) == 1 and "code 137" in str(failed[0]["reason"])
    assert all("\n" not in str(e["reason"]) for e in of(events, "attempt_state") + of(events, "job_state"))
    assert of(events, "job_state")[-1]["state"] == "RESTARTING"


def test_a_preemption_is_logged_with_its_cause(db, events):
    job_id = submit(db)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING)
    with db.write() as session:
        assert preempt_job(session, session.get(Job, job_id), "drain", "agent a is drained", 5)

    (preempted,) = of(events, "job_preempted")
    assert (preempted["job_id"], preempted["attempt"], preempted["cause"]) == (job_id, 1, "drain")
    assert preempted["grace_s"] == 5 and preempted["preemptor_job_id"] is None
    assert of(events, "job_state")[-1]["state"] == "PREEMPTING"


def test_an_agent_lost_then_heard_again_then_removed(db, events):
    job_id = submit(db)
    agent_id, name = agent_of_task(db, job_id, 0)
    with db.write() as session:
        session.get(Agent, agent_id).online_until = utcnow() - timedelta(seconds=1)
    with db.write() as session:
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300)

    (lost,) = of(events, "agent_lost")
    assert (lost["agent"], lost["agent_id"], lost["tasks_lost"]) == (name, agent_id, 1)

    with db.write() as session:
        record_heartbeats(session, {agent_id: utcnow()}, timeout_s=30)
    with db.write() as session:  # heard again while online: nothing more to say
        record_heartbeats(session, {agent_id: utcnow()}, timeout_s=30)
    (back,) = of(events, "agent_back")
    assert (back["agent"], back["agent_id"]) == (name, agent_id)

    with db.write() as session:
        remove_agent(session, name, BACKOFF)
    (removed,) = of(events, "agent_removed")
    assert (removed["agent"], removed["agent_id"]) == (name, agent_id)


def test_a_lost_agent_that_registers_again_is_back(db, events):
    with db.write() as session:
        agent = session.scalars(select(Agent).where(Agent.name == "b")).one()
        agent.online_until = utcnow() - timedelta(seconds=1)
    with db.write() as session:
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300)
    with db.write() as session:
        slot = [{"kind": "cpu", "index": 0, "name": "s"}]
        register_agent(session, Registration("b", "b", "127.0.0.1", 20000, 20010, slot, "t"), 30)

    assert [e["agent"] for e in of(events, "agent_lost")] == ["b"]
    assert [e["agent"] for e in of(events, "agent_back")] == ["b"]
