"""Each attempt's story: real causes driven through the real services on a real SQLite database (a scheduler
pass that preempts or reclaims, a drain, a lost agent, a failing task, a hang, a cancel) leave their cause
and actor on the attempt's ending event, and GET /api/v1/jobs/{id}'s shaping (the router's own job_out)
shows them as each attempt's `ended`, its events and a bounded history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from mwms.server.api.views import job_out
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Attempt, AttemptEvent, Job, utcnow
from mwms.server.schemas import ATTEMPTS_SHOWN, JobCreate
from mwms.server.services import views
from mwms.server.services.fleet import cordons
from mwms.server.services.job_life import hangs
from mwms.server.services.job_life.jobs import cancel_job, create_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler import teams
from mwms.server.services.scheduler.scheduling import SharingPolicy, schedule_pending
from mwms.server.states import JobState, TaskState
from mwms.task_environment import PREEMPTED_AND_SAVED_EXIT_CODE

DIGEST = "e" * 64
POLICY = SharingPolicy(grace_s=15, min_runtime_s=0, max_preemptions_per_hour=4)

# What the shared `db` fixture (tests/conftest.py) holds: two one-slot CPU agents.
pytestmark = pytest.mark.db_seed(DIGEST, agents=("box-a", "box-b"))


def submit(db: Database, workers: int = 2, user: str = "u", **spec: Any) -> str:
    with db.write() as session:
        job = create_job(
            session,
            JobCreate(bundle_digest=DIGEST, command=["python", "t.py"], workers=workers, **spec),
            submitted_by=user,
        )
        return job.id


def schedule(db: Database) -> None:
    with db.write() as session:
        schedule_pending(session, policy=POLICY)


def report(
    db: Database, job_id: str, state: TaskState, exit_code: int | None = None, only: int | None = None
) -> None:
    with db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        for task in job.attempts[-1].tasks:
            if only is None or task.index == only:
                agent = session.get(Agent, task.agent_id)
                apply_report(session, agent, TaskReport(task.id, state, exit_code), backoff_base_s=0)


def running(db: Database, workers: int = 2, **spec: Any) -> str:
    job_id = submit(db, workers, **spec)
    schedule(db)
    report(db, job_id, TaskState.RUNNING)
    return job_id


def shown(db: Database, job_id: str) -> dict[str, Any]:
    """The job as GET /api/v1/jobs/{id} answers it (the router's own shaping), as JSON."""
    with db.read() as session:
        return job_out(views.read_job_view(session, job_id)).model_dump(mode="json")


def agent_named(db: Database, name: str) -> str:
    with db.read() as session:
        return session.scalars(select(Agent.id).where(Agent.name == name)).one()


def test_a_preemption_by_the_scheduler_names_the_job_and_its_priority(db: Database) -> None:
    low = running(db, priority=100)
    urgent = submit(db, priority=900)
    schedule(db)

    first = shown(db, low)["attempt_history"][0]
    assert first["state"] == "PREEMPTED"
    ended = first["ended"]
    assert (ended["kind"], ended["job_id"], ended["priority"]) == ("preempted", urgent, 900)
    assert ended["message"] == f"preempted by job {urgent} (priority 900)"
    assert ended["restart"] is None and ended["agent"] is None
    assert [(e["from_state"], e["to_state"], e["cause"]) for e in first["events"]] == [
        (None, "ACTIVE", ""),
        ("ACTIVE", "PREEMPTED", "preempted"),
    ]
    # Stored as data, not only in the text.
    with db.read() as session:
        event = session.scalars(select(AttemptEvent).where(AttemptEvent.cause == "preempted")).one()
        assert event.details == {"job_id": urgent, "priority": 900}

    # The victim's next attempt is a story of its own; the preempted one keeps its ending.
    report(db, low, TaskState.STOPPED, PREEMPTED_AND_SAVED_EXIT_CODE)
    schedule(db)
    report(db, urgent, TaskState.RUNNING)
    report(db, urgent, TaskState.SUCCEEDED, 0)
    schedule(db)
    history = shown(db, low)["attempt_history"]
    assert [(a["number"], a["state"], a["ended"]) for a in history[1:]] == [(2, "ACTIVE", None)]
    assert history[0]["ended"]["kind"] == "preempted"
    done = shown(db, urgent)["attempt_history"][0]["ended"]
    assert (done["kind"], done["message"]) == ("succeeded", "succeeded: every task exited 0")


def test_a_teams_reclaim_names_the_team_and_the_job_it_made_room_for(db: Database) -> None:
    with db.write() as session:
        teams.add_member(session, "owners", "olga", by="admin")
        teams.add_member(session, "borrowers", "bert", by="admin")
        teams.set_quota(session, "owners", gpus=None, cpu_slots=2, by="admin")
        teams.set_quota(session, "borrowers", gpus=None, cpu_slots=0, by="admin")
    borrower = running(db, user="bert", priority=500)
    with db.read() as session:
        assert session.get(Job, borrower).attempts[0].borrowed  # placed over its quota, on idle slots
    owner = submit(db, user="olga", priority=500)
    schedule(db)

    ended = shown(db, borrower)["attempt_history"][0]["ended"]
    assert (ended["kind"], ended["team"], ended["job_id"], ended["priority"]) == (
        "reclaimed",
        "owners",
        owner,
        500,
    )
    assert ended["message"] == f"preempted: team owners reclaims its quota for job {owner}"


def test_a_drain_names_the_agent_and_the_admin(db: Database) -> None:
    job_id = running(db, workers=1)
    with db.read() as session:
        agent = session.get(Job, job_id).attempts[0].tasks[0].agent_id
        name = session.get(Agent, agent).name
    with db.write() as session:
        cordons.drain(session, name, "root", "kernel update", None, False, default_grace_s=5)

    ended = shown(db, job_id)["attempt_history"][0]["ended"]
    assert (ended["kind"], ended["agent"], ended["agent_id"], ended["by"]) == ("drained", name, agent, "root")
    assert ended["details"] == {"note": "kernel update"}
    assert ended["message"] == f"drained from agent {name} by root (kernel update)"


def test_a_lost_agent_names_the_agent_its_task_and_the_restart(db: Database) -> None:
    job_id = running(db)
    with db.write() as session:
        # box-b keeps heartbeating; box-a falls silent.
        session.get(Agent, agent_named(db, "box-b")).online_until = utcnow() + timedelta(hours=1)
    with db.write() as session:
        reconcile(
            session, backoff_base_s=0, default_startup_timeout_s=300, now=utcnow() + timedelta(minutes=5)
        )

    job = shown(db, job_id)
    ended = job["attempt_history"][0]["ended"]
    with db.read() as session:
        lost_task = next(t for t in session.get(Job, job_id).attempts[0].tasks if t.state == "LOST")
    assert (ended["kind"], ended["agent"], ended["task"]) == ("agent_lost", "box-a", lost_task.index)
    assert (ended["restart"], ended["restart_cause"], ended["details"]["how"]) == (1, "agent_lost", "silent")
    assert (
        ended["message"]
        == f"lost agent box-a (task {lost_task.index}): it stopped heartbeating; restart 1 of 3"
    )
    assert job["state"] == JobState.RESTARTING.value


def test_a_failed_task_names_the_task_its_exit_code_and_the_restart_cause(db: Database) -> None:
    job_id = running(db)
    report(db, job_id, TaskState.FAILED, 137, only=1)
    report(db, job_id, TaskState.STOPPED, 143, only=0)

    ended = shown(db, job_id)["attempt_history"][0]["ended"]
    with db.read() as session:
        agent = session.get(Agent, session.get(Job, job_id).attempts[0].tasks[1].agent_id).name
    assert (ended["kind"], ended["task"], ended["exit_code"], ended["agent"]) == (
        "task_failed",
        1,
        137,
        agent,
    )
    assert (ended["restart"], ended["restart_cause"]) == (1, "signal")
    assert ended["message"] == f"task 1 failed on agent {agent}: exit code 137 (SIGKILL); restart 1 of 3"


def test_a_permanent_failure_has_no_restart(db: Database) -> None:
    job_id = running(db, restart={"max_restarts": 2})
    report(db, job_id, TaskState.FAILED, 3, only=0)
    report(db, job_id, TaskState.STOPPED, 143, only=1)

    ended = shown(db, job_id)["attempt_history"][0]["ended"]
    assert (ended["kind"], ended["exit_code"], ended["restart"], ended["restart_cause"]) == (
        "task_failed",
        3,
        None,
        None,
    )
    assert ended["message"].endswith(": exit code 3")


def test_a_hang_and_a_cancel(db: Database) -> None:
    job_id = running(db)
    with db.read() as session:
        attempt_id = session.get(Job, job_id).attempts[0].id
    with db.write() as session:
        assert hangs.act_on_hang(session, job_id, attempt_id, 90, None, backoff_base_s=0)
    ended = shown(db, job_id)["attempt_history"][0]["ended"]
    assert (ended["kind"], ended["details"]["timeout_s"], ended["restart_cause"]) == ("hang", 90, "hang")
    assert ended["message"] == "hung: no progress for 90 s; restart 1 of 3"

    report(db, job_id, TaskState.STOPPED, 143)
    schedule(db)
    with db.write() as session:
        cancel_job(session, job_id, by="alice")
    second = shown(db, job_id)["attempt_history"][1]["ended"]
    assert (second["kind"], second["by"], second["message"]) == ("cancelled", "alice", "cancelled by alice")


def test_the_history_shows_the_newest_attempts_and_old_rows_read_as_unrecorded(db: Database) -> None:
    job_id = submit(db)
    with db.write() as session:
        start = utcnow() - timedelta(hours=1)
        for number in range(1, ATTEMPTS_SHOWN + 6):
            attempt = Attempt(
                job_id=job_id, number=number, state="FAILED", reason=f"old ending {number}\nlog"
            )
            attempt.created_at, attempt.ended_at = start, start + timedelta(minutes=1)
            session.add(attempt)
            session.flush()
            # As an event written before endings were recorded: no cause, no details.
            session.add(
                AttemptEvent(attempt_id=attempt.id, from_state="ACTIVE", to_state="FAILED", reason="x")
            )
    job = shown(db, job_id)
    numbers = [a["number"] for a in job["attempt_history"]]
    assert job["attempts"] == ATTEMPTS_SHOWN + 5
    assert numbers == list(range(6, ATTEMPTS_SHOWN + 6))
    last = job["attempt_history"][-1]["ended"]
    assert (last["kind"], last["message"]) == ("unrecorded", f"old ending {ATTEMPTS_SHOWN + 5}")
