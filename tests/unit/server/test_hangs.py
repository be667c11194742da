"""Stack requests and hang detection through the services and the detector on a real SQLite database, with
real dumps as the agents' answers (testkit/mwms_testkit/stack_dumps) and a hub without agent streams."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job, StackDump, StackRequest, utcnow
from mwms.server.errors import Conflict
from mwms.server.live.hang_detector import HANG_DETECTIONS, HangDetector
from mwms.server.live.hub import AgentHub
from mwms.server.live.stack_collector import StackCollector
from mwms.server.live.task_progress import TaskProgress
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life import hangs
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.observing import stacks
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.settings import Settings
from mwms.server.states import TaskState
from mwms_testkit import STACK_DUMPS

DUMPS = STACK_DUMPS
WAITING = (DUMPS / "py_spy_worker0_step_in_tf_function.txt").read_text()
SLEEPING = (DUMPS / "py_spy_worker1_sleeping.txt").read_text()


# What the shared `db` fixture (tests/conftest.py) holds.
pytestmark = pytest.mark.db_seed("c" * 64, agents=("a", "b", "c", "d"))


def running_job(db: Database, **spec) -> str:
    """A 2-worker job placed and RUNNING (every task reported RUNNING with a pid)."""
    with db.write() as session:
        job = create_job(
            session, JobCreate(bundle_digest="c" * 64, command=["python", "t.py"], workers=2, **spec)
        )
        schedule_pending(session)
        for task in job.attempts[-1].tasks:
            agent = session.get(Agent, task.agent_id)
            report = TaskReport(task.id, TaskState.RUNNING, pid=1000 + task.index)
            apply_report(session, agent, report, backoff_base_s=1.0)
        return job.id


def answer(db: Database, opened: stacks.OpenedRequest, texts: dict[int, str]) -> None:
    with db.write() as session:
        for asked in opened.asked:
            incoming = stacks.IncomingStackDump(
                opened.request_id,
                asked.task_id,
                1000 + asked.task_index,
                "py-spy",
                texts[asked.task_index],
                "",
            )
            assert stacks.store_stack_dump(session, asked.agent_id, incoming)


def test_the_hang_timeout_of_a_job() -> None:
    assert hangs.hang_timeout({}, 0.0) is None
    assert hangs.hang_timeout({}, 30.0) == 30.0
    assert hangs.hang_timeout({"hang_timeout_seconds": 5}, 30.0) == 5.0
    assert hangs.hang_timeout({"hang_timeout_seconds": 0}, 30.0) is None  # the job turns it off
    for damaged in (math.nan, True, "5", -1, 1e12):
        assert hangs.hang_timeout({"hang_timeout_seconds": damaged}, 30.0) is None


def test_a_request_holds_one_row_per_running_task_until_answered(db):
    job_id = running_job(db)
    with db.write() as session:
        opened = stacks.open_stack_request(session, job_id, "request", "ann", any_owner=True)
    assert opened.attempt == 1 and sorted(a.task_index for a in opened.asked) == [0, 1]
    with db.read() as session:
        pending = stacks.read_stack_request(session, job_id)
        assert [stacks.answered(d) for d in pending.dumps] == [False, False]
        assert pending.dumps[0].error.startswith("no answer from agent ")

    answer(db, opened, {0: WAITING, 1: SLEEPING})
    with db.write() as session:
        request = stacks.read_stack_request(session, job_id, opened.request_id)
        assert [(d.task_index, d.in_collective, d.pid) for d in request.dumps] == [
            (0, True, 1000),
            (1, False, 1001),
        ]
        where = stacks.describe_workers_outside_collectives(session, opened.request_id)
        assert where.startswith("not in a collective: worker 1 on agent ")
        assert "(pid 1001, in wait_before_first_allreduce (prog.py:24))" in where and "worker 0" not in where
        # An answer from an agent that was not asked is dropped.
        other = next(a for a in opened.asked if a.task_index == 0)
        wrong = stacks.IncomingStackDump(opened.request_id, other.task_id, 1, "py-spy", SLEEPING, "")
        assert not stacks.store_stack_dump(session, "someone-else", wrong)


def test_no_running_attempt_is_a_conflict(db):
    with db.write() as session:
        job = create_job(session, JobCreate(bundle_digest="c" * 64, command=["python", "t.py"], workers=3))
    with db.write() as session, pytest.raises(Conflict, match="no running attempt"):
        stacks.open_stack_request(session, job.id, "request", "ann", any_owner=True)


def test_a_hang_restarts_while_restarts_remain_then_fails(db):
    job_id = running_job(db, restart={"max_restarts": 0}, hang_timeout_seconds=5)
    with db.write() as session:
        opened = stacks.open_stack_request(session, job_id, "hang", "hang detection")
    answer(db, opened, {0: WAITING, 1: SLEEPING})
    with db.read() as session:
        (watched,) = hangs.running_attempts(session, 0.0)
    assert watched.timeout_s == 5.0 and len(watched.tasks) == 2
    with db.write() as session:
        reason = hangs.act_on_hang(
            session, job_id, watched.attempt_id, 5.0, opened.request_id, backoff_base_s=1.0
        )
        job = session.get(Job, job_id)
        assert job.state == "FAILED" and job.reason == reason
        assert reason.startswith("no progress for 5 s (no log line or metric point from any worker); ")
        assert "not in a collective: worker 1 on agent" in reason
        # Once the attempt has ended, a second verdict changes nothing.
        assert hangs.act_on_hang(session, job_id, watched.attempt_id, 5.0, None, backoff_base_s=1.0) is None

    restartable = running_job(db, restart={"max_restarts": 2})
    with db.read() as session:
        (watched,) = hangs.running_attempts(session, 7.0)  # the coordinator's default applies
    with db.write() as session:
        hangs.act_on_hang(session, restartable, watched.attempt_id, 7.0, None, backoff_base_s=1.0)
        job = session.get(Job, restartable)
        assert job.state == "RESTARTING" and job.restarts == 1
        assert "no progress for 7 s" in job.reason and "no stacks could be taken" in job.reason
        assert "restart 1 of 2" in job.reason


def test_the_detector_flags_a_silent_attempt_once_and_progress_holds_it_off(db):
    quiet = running_job(db, hang_timeout_seconds=5, restart={"max_restarts": 0})
    now = [utcnow()]

    def clock() -> datetime:
        return now[0]

    async def scenario() -> None:
        hub = AgentHub(asyncio.get_running_loop(), db)  # no agent streams: every dump is unreachable
        progress = TaskProgress()
        detector = HangDetector(
            db,
            Settings(data_dir=Path("/nonexistent")),
            StackCollector(db, hub),
            progress,
            lambda _: None,
            lambda: None,
            clock,
        )
        with db.read() as session:
            task_ids = [t.id for t in session.get(Job, quiet).attempts[-1].tasks]
        now[0] += timedelta(seconds=4)
        await detector.check()
        assert state(quiet) == "RUNNING"
        progress.seen([task_ids[1]], at=now[0])  # a log line of worker 1 restarts the clock
        now[0] += timedelta(seconds=4)
        await detector.check()
        assert state(quiet) == "RUNNING"
        before = HANG_DETECTIONS._value.get()
        now[0] += timedelta(seconds=2)
        await detector.check()
        assert state(quiet) == "FAILED"
        assert HANG_DETECTIONS._value.get() == before + 1
        await detector.check()
        assert HANG_DETECTIONS._value.get() == before + 1

    def state(job_id: str) -> str:
        with db.read() as session:
            return session.get(Job, job_id).state

    asyncio.run(scenario())
    with db.read() as session:
        job = session.get(Job, quiet)
        assert "no progress for 5 s" in job.reason
        assert "no stacks from worker 0 on agent" in job.reason and "its agent is not connected" in job.reason
        request = session.query(StackRequest).filter_by(job_id=quiet).one()
        assert request.cause == "hang" and request.requested_by == "hang detection"
        assert session.query(StackDump).filter_by(request_id=request.id).count() == 2
