"""The coordinator's Prometheus instruments against a real SQLite database and the real services: changes are
counted only once committed, the job lifecycle feeds the histograms and counters, and the cluster gauges
are counted in a fixed number of aggregate queries however many rows there are."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select, update

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent, Bundle, Job, Task, utcnow
from mwms.server.observability.on_commit import on_commit
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import Registration, register_agent, remove_agent
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.job_life.transitions import transition_job
from mwms.server.services.observing.cluster_counts import count_cluster
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.states import JobState, TaskState
from mwms_testkit.sql_statements import recorded, selects

DIGEST = "e" * 64


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# What the shared `db` fixture (tests/conftest.py) holds.
pytestmark = pytest.mark.db_seed(DIGEST)


def add_agents(db: Database, count: int, prefix: str = "a", kind: str = "cpu", devices: int = 1) -> list[str]:
    with db.write() as session:
        agents = [
            register_agent(
                session,
                Registration(
                    f"{prefix}{i}",
                    f"{prefix}{i}",
                    "127.0.0.1",
                    20000,
                    20010,
                    [{"kind": kind, "index": d, "name": f"{kind}{d}"} for d in range(devices)],
                    "t",
                ),
                30,
            )
            for i in range(count)
        ]
        return [agent.id for agent in agents]


def submit(db: Database, workers: int = 1, **spec: Any) -> str:
    with db.write() as session:
        job = create_job(
            session, JobCreate(bundle_digest=DIGEST, command=["python", "t.py"], workers=workers, **spec)
        )
        schedule_pending(session)
        return job.id


# --- on_commit ---------------------------------------------------------------------------------------------


def test_on_commit_runs_after_the_outermost_commit_and_never_after_a_rollback(db: Database) -> None:
    ran: list[str] = []
    with db.write() as session:
        on_commit(session, lambda: ran.append("committed"))
        assert ran == []
    assert ran == ["committed"]

    with contextlib.suppress(RuntimeError), db.write() as session:
        on_commit(session, lambda: ran.append("rolled back"))
        raise RuntimeError("the transaction fails")
    assert ran == ["committed"]

    with db.write() as session:
        with contextlib.suppress(RuntimeError), session.begin_nested():
            on_commit(session, lambda: ran.append("savepoint rolled back"))
            raise RuntimeError("one item fails")
        with session.begin_nested():
            on_commit(session, lambda: ran.append("savepoint released"))
        assert ran == ["committed"], "a released savepoint waits for the outermost commit"
        on_commit(session, lambda: ran.append("outer"))
    assert ran == ["committed", "savepoint released", "outer"]

    with contextlib.suppress(RuntimeError), db.write() as session:
        with session.begin_nested():
            on_commit(session, lambda: ran.append("released, then all rolled back"))
        raise RuntimeError("the transaction fails after the savepoint")
    assert ran == ["committed", "savepoint released", "outer"]


def test_a_failing_action_does_not_undo_the_commit(db: Database) -> None:
    with db.write() as session:
        on_commit(session, lambda: 1 / 0)  # type: ignore[func-returns-value]
        session.add(Bundle(digest="f" * 64, size=1, archive_format="tar.gz"))
    with db.read() as session:
        assert session.get(Bundle, "f" * 64) is not None


# --- the job lifecycle feeds the histograms and counters ---------------------------------------------------


def test_scheduling_latency_and_duration_are_observed_once_committed(db: Database) -> None:
    add_agents(db, 1)
    latency_before = sample("mwms_scheduling_latency_seconds_count", attempt="first")
    duration_before = sample("mwms_job_duration_seconds_count", state="SUCCEEDED")
    job_id = submit(db)

    with contextlib.suppress(RuntimeError), db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.SCHEDULED.value
        transition_job(session, job, JobState.RUNNING, "every worker is running")
        raise RuntimeError("rolled back: the job never ran")
    assert sample("mwms_scheduling_latency_seconds_count", attempt="first") == latency_before

    with db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        transition_job(session, job, JobState.RUNNING, "every worker is running")
    assert sample("mwms_scheduling_latency_seconds_count", attempt="first") == latency_before + 1
    assert sample("mwms_job_duration_seconds_count", state="SUCCEEDED") == duration_before

    with db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        transition_job(session, job, JobState.SUCCEEDED, "every task exited 0")
    assert sample("mwms_job_duration_seconds_count", state="SUCCEEDED") == duration_before + 1


def test_a_start_up_timeout_restart_is_counted_by_its_cause(db: Database) -> None:
    add_agents(db, 1)
    before = sample("mwms_job_restarts_total", cause="startup_timeout")
    job_id = submit(db, restart={"max_restarts": 2}, startup_timeout_seconds=5)
    with db.write() as session:
        # 10 s on: past the start-up timeout, well within the agent's (30 s), so the agent is not lost.
        reconcile(
            session, backoff_base_s=1, default_startup_timeout_s=5, now=utcnow() + timedelta(seconds=10)
        )
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.RESTARTING.value, job.reason
    assert sample("mwms_job_restarts_total", cause="startup_timeout") == before + 1
    assert "did not start within the start-up timeout" in job.reason


def test_registrations_are_counted(db: Database) -> None:
    before = sample("mwms_agent_registrations_total")
    add_agents(db, 3)
    assert sample("mwms_agent_registrations_total") == before + 3


# --- cluster gauges ------------------------------------------------------------------------------------------


def test_cluster_counts_jobs_tasks_agents_and_devices(db: Database) -> None:
    check_cluster_counts(db)


def test_cluster_counts_on_postgres(postgres) -> None:
    """The same queries (JSON functions, CASE grouping) on a real PostgreSQL server."""
    database = Database(postgres.create_database("cluster_counts"))
    upgrade_to_head(database.engine)
    with database.write() as session:
        session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))
    try:
        check_cluster_counts(database)
    finally:
        database.dispose()


def check_cluster_counts(db: Database) -> None:
    gpu_agents = add_agents(db, 2, prefix="g", kind="gpu", devices=4)
    cpu_agents = add_agents(db, 3, prefix="c")
    with db.write() as session:
        lost = session.get(Agent, cpu_agents[1])
        assert lost is not None
        lost.online_until = utcnow() - timedelta(seconds=1)
        remove_agent(session, cpu_agents[2], backoff_base_s=1)
    gpu_job = submit(db, workers=2, gpus_per_worker=3)
    submit(db, workers=1)
    submit(db, workers=5)  # does not fit: stays PENDING

    with db.read() as session:
        counts = count_cluster(session)
        placed = session.scalars(select(Task).where(Task.job_id == gpu_job)).all()
    assert {t.agent_id for t in placed} == set(gpu_agents)
    assert counts.jobs_by_state == {"SCHEDULED": 2, "PENDING": 1}
    assert counts.tasks_by_state == {"ASSIGNED": 3}
    assert counts.agents_by_liveness == {"online": 3, "lost": 1, "removed": 1}
    assert counts.devices_by_kind == {"gpu": 8, "cpu": 1}
    assert counts.devices_used_by_kind == {"gpu": 6, "cpu": 1}


def test_cluster_counts_take_the_same_few_queries_at_any_size(db: Database) -> None:
    def queries() -> int:
        with recorded(db.engine, selects) as statements, db.read() as session:
            count_cluster(session)
        return len(statements)

    add_agents(db, 2)
    submit(db)
    small = queries()
    add_agents(db, 40, prefix="more")
    for _ in range(20):
        submit(db, workers=2)
    assert queries() == small == 4


def test_a_killed_worker_and_a_lost_agent_restart_with_their_causes(db: Database) -> None:
    (agent_id,) = add_agents(db, 1)
    lost_before = sample("mwms_job_restarts_total", cause="agent_lost")
    signal_before = sample("mwms_job_restarts_total", cause="signal")
    killed = submit(db, restart={"max_restarts": 2})
    with db.write() as session:
        agent = session.get(Agent, agent_id)
        (task,) = session.scalars(select(Task).where(Task.job_id == killed)).all()
        assert agent is not None
        apply_report(session, agent, TaskReport(task.id, TaskState.RUNNING, pid=1), backoff_base_s=1)
        apply_report(session, agent, TaskReport(task.id, TaskState.FAILED, exit_code=137), backoff_base_s=1)
    assert sample("mwms_job_restarts_total", cause="signal") == signal_before + 1

    restarted_before = sample("mwms_scheduling_latency_seconds_count", attempt="restart")
    with db.write() as session:  # the backoff is over: the restarted job is placed on the agent again
        session.execute(update(Job).where(Job.id == killed).values(not_before=None))
        schedule_pending(session)
        (again,) = session.scalars(select(Task).where(Task.job_id == killed, Task.state == "ASSIGNED")).all()
        agent = session.get(Agent, agent_id)
        assert agent is not None
        apply_report(session, agent, TaskReport(again.id, TaskState.RUNNING, pid=2), backoff_base_s=1)
    assert sample("mwms_scheduling_latency_seconds_count", attempt="restart") == restarted_before + 1
    with db.write() as session:  # a minute of silence: the agent is lost, with the task it held
        reconcile(
            session, backoff_base_s=1, default_startup_timeout_s=0, now=utcnow() + timedelta(seconds=60)
        )
    assert sample("mwms_job_restarts_total", cause="agent_lost") == lost_before + 1
