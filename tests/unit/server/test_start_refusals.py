"""A command the agent cannot execute fails its job at the first report, whatever the restart policy; a
refused task shows no exit code; stops carry the job's own grace, else the coordinator's short default.
Runs the services on a real SQLite database."""

from __future__ import annotations

import pytest

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import cancel_job, create_job
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.settings import Settings
from mwms.server.states import JobState, TaskState
from mwms.task_environment import COMMAND_NOT_FOUND_EXIT_CODE

pytestmark = pytest.mark.db_seed("d" * 64, agents=("a", "b", "c"))
NOT_FOUND = "never started: 'python train.py --epochs 1' was not found on the agent's PATH"


def submit(db: Database, **spec) -> str:
    with db.write() as session:
        job = create_job(
            session,
            JobCreate(**{"bundle_digest": "d" * 64, "command": ["python", "t.py"], "workers": 2, **spec}),
        )
        schedule_pending(session)
        return job.id


def report(db: Database, job_id: str, index: int, state: TaskState, exit_code=None, message="", pid=None):
    with db.write() as session:
        task = session.get(Job, job_id).attempts[-1].tasks[index]
        agent = session.get(Agent, task.agent_id)
        apply_report(session, agent, TaskReport(task.id, state, exit_code, message, pid), backoff_base_s=0.0)


def read(db: Database, job_id: str) -> Job:
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        _ = [t.state for a in job.attempts for t in a.tasks]
        return job


@pytest.mark.parametrize("restart_on", ["retryable", "any"])
def test_a_command_that_cannot_be_executed_fails_the_job_at_the_first_report(db, restart_on):
    job_id = submit(db, restart={"max_restarts": 3, "restart_on": restart_on})
    report(db, job_id, 1, TaskState.RUNNING, pid=4242)
    report(db, job_id, 0, TaskState.FAILED, COMMAND_NOT_FOUND_EXIT_CODE, NOT_FOUND)
    job = read(db, job_id)
    assert job.state == JobState.FAILED.value and job.restarts == 0 and len(job.attempts) == 1
    assert job.reason.startswith(
        f"task 0 on agent a: {NOT_FOUND} (not retried: the command cannot be executed"
    )
    assert "fix the command and submit again" in job.reason
    tasks = job.attempts[0].tasks
    assert (tasks[0].exit_code, tasks[0].pid) == (COMMAND_NOT_FOUND_EXIT_CODE, None)
    assert tasks[1].stop_requested  # the peer that did start is stopped


def test_exit_127_of_a_program_that_ran_is_an_ordinary_failure(db):
    job_id = submit(db, restart={"max_restarts": 2, "restart_on": "any"})
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING, pid=100 + index)
    report(db, job_id, 0, TaskState.FAILED, 127, "exited with code 127")
    report(db, job_id, 1, TaskState.STOPPED, 143, "stopped")
    job = read(db, job_id)
    assert job.state == JobState.RESTARTING.value and job.restarts == 1


def test_a_refused_task_has_no_exit_code(db):
    job_id = submit(db)
    report(db, job_id, 0, TaskState.REJECTED, 0, "port 20001 is already in use on host h")
    job = read(db, job_id)
    assert job.state == JobState.PENDING.value
    assert job.attempts[0].tasks[0].exit_code is None


def test_a_task_stopped_before_its_spawn_has_no_exit_code(db):
    job_id = submit(db)
    with db.write() as session:
        cancel_job(session, job_id, by="alice")
    report(db, job_id, 0, TaskState.STOPPED, 0, "cancelled by alice")
    assert read(db, job_id).attempts[0].tasks[0].exit_code is None


def test_a_cancel_uses_the_jobs_own_grace_and_otherwise_the_short_default(db):
    plain = submit(db, workers=1)
    patient = submit(db, workers=1, preemption_grace_seconds=25)
    with db.write() as session:
        cancel_job(session, plain, by="alice")
        cancel_job(session, patient, by="alice")
    assert read(db, plain).attempts[0].tasks[0].stop_grace_s is None  # MWMS_STOP_GRACE_S goes out
    assert read(db, patient).attempts[0].tasks[0].stop_grace_s == 25
    assert Settings.model_fields["stop_grace_s"].default == 1


def test_a_failed_peer_stops_the_others_with_the_jobs_grace(db):
    job_id = submit(db, preemption_grace_seconds=7)
    for index in (0, 1):
        report(db, job_id, index, TaskState.RUNNING, pid=100 + index)
    report(db, job_id, 0, TaskState.FAILED, 1, "exited with code 1")
    other = read(db, job_id).attempts[0].tasks[1]
    assert other.stop_requested and other.stop_grace_s == 7
