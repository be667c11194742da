"""A job's own Python environment at the coordinator: stored with its packages, told to every task's start,
and where each task's build stands; the start-up timeout waits while a build runs and counts from the
moment the last one was ready."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from pydantic import ValidationError

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job, utcnow
from mwms.server.rpc.convert import start_task, task_report
from mwms.server.schemas import EnvironmentIn, JobCreate
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.job_life.start_commands import StartDefaults, start_spec
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.states import TaskState
from mwms.v1 import agent_pb2 as pb

pytestmark = pytest.mark.db_seed("c" * 64, agents=("a", "b"))
LOCK = "numpy==2.4.6 ; python_full_version < '3.12'\nnumpy==2.5.5 ; python_full_version >= '3.12'\ntabulate==0.9.0\n"


def submit(db: Database) -> str:
    environment = EnvironmentIn(requirements="requirements.txt", python="3.11", locked=LOCK)
    spec = JobCreate(
        bundle_digest="c" * 64,
        command=["python", "t.py"],
        workers=2,
        startup_timeout_seconds=60,
        environment=environment,
    )
    with db.write() as session:
        job = create_job(session, spec)
        schedule_pending(session)
        return job.id


def report(
    db: Database,
    job_id: str,
    index: int,
    environment: str,
    seconds: float | None = None,
    digest: str = "d" * 64,
    platform: str = "CPython 3.11.7 linux x86_64",
) -> None:
    with db.write() as session:
        task = session.get(Job, job_id).attempts[-1].tasks[index]
        agent = session.get(Agent, task.agent_id)
        update = TaskReport(
            task.id, TaskState.STARTING, None, f"environment {environment}", None, environment, seconds
        )
        if environment == "ready":
            update = replace(update, environment_digest=digest, environment_platform=platform)
        apply_report(session, agent, update, backoff_base_s=1.0)


def age_attempt(db: Database, job_id: str, seconds: float) -> None:
    with db.write() as session:
        session.get(Job, job_id).attempts[-1].created_at = utcnow() - timedelta(seconds=seconds)


def reconciled_state(db: Database, job_id: str) -> str:
    with db.write() as session:
        reconcile(session, backoff_base_s=1.0, default_startup_timeout_s=300)
    with db.read() as session:
        return session.get(Job, job_id).state


def test_the_lock_is_stored_listed_and_sent_with_every_start(db: Database) -> None:
    job_id = submit(db)
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job.environment["packages"] == [
            "numpy==2.4.6 ; python_full_version < '3.12'",
            "numpy==2.5.5 ; python_full_version >= '3.12'",
            "tabulate==0.9.0",
        ]
        message = start_task(start_spec(job.attempts[0].tasks[1], job, StartDefaults(stop_grace_s=10)))
    assert message.start.environment_lock == LOCK and message.start.environment_python == "3.11"


def test_the_startup_timeout_waits_while_a_build_runs_and_counts_from_the_last_ready(db: Database) -> None:
    job_id = submit(db)
    report(db, job_id, 0, "building")
    report(db, job_id, 1, "building")
    age_attempt(db, job_id, 3600)
    assert reconciled_state(db, job_id) == "SCHEDULED"  # an hour of building: not a start-up timeout

    report(db, job_id, 0, "ready", 3500.0)
    assert reconciled_state(db, job_id) == "SCHEDULED"  # one still builds
    report(db, job_id, 1, "ready", 0.0)
    report(db, job_id, 1, "ready", 0.0)  # a resend changes nothing
    assert reconciled_state(db, job_id) == "SCHEDULED"  # the 60 s count from now
    with db.read() as session:
        tasks = session.get(Job, job_id).attempts[-1].tasks
        assert [(t.environment, t.environment_build_s) for t in tasks] == [("ready", 3500.0), ("ready", 0.0)]
        assert tasks[0].message == "environment ready"
    with db.write() as session:
        for task in session.get(Job, job_id).attempts[-1].tasks:
            task.environment_ready_at = utcnow() - timedelta(seconds=61)
    assert reconciled_state(db, job_id) == "RESTARTING"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("locked", "tabulate>=0.9\n", "line 1 of the lock is not a requirement pinned to one version"),
        ("locked", "--index-url https://elsewhere/simple\n", "an option (--index-url)"),
        ("python", "2.7", "String should match pattern"),
    ],
)
def test_an_environment_that_is_not_a_lock_is_refused_saying_why(field: str, value: str, says: str) -> None:
    fields = {"requirements": "requirements.txt", "locked": "tabulate==0.9.0\n", field: value}
    with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        EnvironmentIn(**fields)


def test_workers_whose_environments_differ_never_run_together(db: Database) -> None:
    job_id = submit(db)
    report(db, job_id, 0, "ready", 3.0, digest="a" * 64, platform="CPython 3.11.7 linux x86_64")
    report(db, job_id, 1, "ready", 3.0, digest="b" * 64, platform="CPython 3.12.3 linux x86_64")
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job.state == "FAILED", job.reason
        assert (
            "the workers would run different packages: worker 0 on a (CPython 3.11.7 linux x86_64) and "
            in job.reason
        )
        assert "worker 1 on b (CPython 3.12.3 linux x86_64)" in job.reason and "--python" in job.reason
        assert job.restarts == 0


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), float("-inf"), -1.0])
def test_an_agents_hostile_environment_report_is_bounded(seconds: float) -> None:
    hostile = pb.TaskReport(
        task_id="t",
        state=pb.TASK_STATE_STARTING,
        environment=pb.ENVIRONMENT_STATUS_READY,
        environment_build_seconds=seconds,
        environment_digest="d" * 10_000,
        environment_platform="p" * 10_000,
        message="m" * 10_000_000,
    )
    read = task_report(hostile)
    assert read is not None and read.environment == "ready"
    assert read.environment_build_s is None  # a non-finite or negative number says nothing
    assert len(read.environment_digest) == 64 and len(read.environment_platform) == 100
    assert read.message == "m" * 4000  # kept with the task and quoted in its job's reason
    huge = task_report(
        pb.TaskReport(
            task_id="t", state=pb.TASK_STATE_STARTING, environment=2, environment_build_seconds=1e300
        )
    )
    assert huge is not None and huge.environment_build_s == 1e7
