"""Poison values are contained, non-finite metrics are data: a real coordinator (its gRPC server on loopback,
SQLite, REST and background loops) fed bad batches over a real Connect stream and bad rows written straight
into its database. One bad point, message or row is refused or skipped with a reason; nothing else stops.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job, utcnow
from mwms.server.poison import POISON
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.agent_streams import (
    ADMIN_TOKEN,
    JOIN_TOKEN,
    NOW_MS,
    Coordinator,
    hello,
    point,
)
from mwms_testkit.cluster import wait_until
from mwms_testkit.in_process_coordinator import coordinator_settings


def poison_count(kind: str) -> float:
    return POISON.labels(kind=kind)._value.get()


# --- streams: non-finite metrics are data, bad points are refused with a reason ---------------------------


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    with ExitStack() as stack:
        yield Coordinator.for_streams(stack, tmp_path / "coordinator")


def test_non_finite_points_are_stored_and_bad_points_refused_without_ending_the_stream(
    coordinator: Coordinator,
) -> None:
    agent_id, stream = coordinator.join("nan-agent")
    task = coordinator.running_job(agent_id)
    hello(stream, agent_id, task)
    before = poison_count("metric_point")
    batch = [
        point(1, 1, 1.0),
        point(2, 2, math.nan),
        point(3, 3, math.inf),
        point(4, 4, -math.inf),
        point(5, 5, 0.5, unix_ms=10**18),  # a metric time of 1e15 s: used to abort the stream
        point(6, 6, 0.5, unix_ms=-(10**18)),
        point(7, 7, 0.5, name="x" * 300),
        point(8, 2**40, 0.5),
        point(9, 8, -0.0),
        point(10, 9, 0.25),
    ]
    stream.send(metrics=pb.MetricBatch(task_id=task.id, points=batch))
    ack = stream.next("ack", where=lambda a: a.metric_seq)
    assert (ack.task_id, ack.metric_seq, ack.rejected) == (task.id, 10, 4)
    assert ack.reject_reason.startswith("seq 5: time 1000000000000000000 ms is outside"), ack.reject_reason
    assert "INSERT" not in ack.reject_reason and "(and more)" in ack.reject_reason
    assert poison_count("metric_point") == before + 4

    # The stream lives on: a heartbeat is answered, and a resend of the same batch stores nothing twice.
    stream.send(heartbeat=pb.Heartbeat(sent_unix_ms=NOW_MS))
    stream.next("ack", where=lambda a: not a.task_id)
    stream.send(metrics=pb.MetricBatch(task_id=task.id, points=batch))
    assert stream.next("ack", where=lambda a: a.metric_seq).metric_seq == 10

    series = coordinator.http.get(f"/api/v1/jobs/{task.job_id}/metrics").json()["points"]
    assert [(p["step"], p["value"]) for p in series] == [
        (1, 1.0),
        (2, "NaN"),
        (3, "Infinity"),
        (4, "-Infinity"),
        (8, -0.0),
        (9, 0.25),
    ]
    assert coordinator.job(task.job_id)["loss"] == 0.25
    stream.send(metrics=pb.MetricBatch(task_id=task.id, points=[point(11, 10, math.nan)]))
    stream.next("ack", where=lambda a: a.metric_seq == 11)
    assert coordinator.job(task.job_id)["loss"] == "NaN"
    listed = coordinator.http.get("/api/v1/jobs").json()["jobs"]
    assert [j["loss"] for j in listed if j["id"] == task.job_id] == ["NaN"]
    assert coordinator.job(task.job_id)["state"] == "RUNNING"  # no fail_on_nan: NaN is only data
    assert 'mwms_poison_total{kind="metric_point"}' in coordinator.http.get("/metrics").text

    # Log lines: a NUL is kept as U+FFFD, a line with an impossible time is refused, the rest stored.
    lines = [
        pb.LogLine(seq=1, stream="stdout", text="nul\x00here", unix_ms=NOW_MS),
        pb.LogLine(seq=2, stream="stdout", text="from the far future", unix_ms=2**62),
        pb.LogLine(seq=3, stream="stderr", text="after", unix_ms=NOW_MS),
    ]
    stream.send(logs=pb.LogBatch(task_id=task.id, lines=lines))
    ack = stream.next("ack", where=lambda a: a.log_seq)
    assert (ack.log_seq, ack.rejected) == (3, 1) and "seq 2: time" in ack.reject_reason
    texts = [x["text"] for x in coordinator.http.get(f"/api/v1/jobs/{task.job_id}/logs").json()["lines"]]
    assert texts == ["nul\ufffdhere", "after"]
    stream.close()


def test_fail_on_nan_fails_the_job_at_the_first_nan_of_that_metric(coordinator: Coordinator) -> None:
    agent_id, stream = coordinator.join("fail-fast-agent")
    task = coordinator.running_job(agent_id, {"restart": {"max_restarts": 3, "fail_on_nan": ["loss"]}})
    hello(stream, agent_id, task)
    batch = [
        point(1, 1, 2.0),
        point(2, 2, math.nan, name="accuracy"),
        point(3, 3, 1.0),
        point(4, 4, math.nan),
    ]
    stream.send(metrics=pb.MetricBatch(task_id=task.id, points=batch))
    assert stream.next("ack", where=lambda a: a.metric_seq).rejected == 0
    stop = stream.next("stop", where=lambda s: s.task_id == task.id)
    job = coordinator.job(task.job_id)
    assert job["state"] == "FAILED" and job["restarts"] == 0
    assert "'loss' was NaN at step 4" in job["reason"] and "fail_on_nan" in job["reason"], job["reason"]
    assert "NaN at step 4" in stop.reason
    assert job["restart"]["fail_on_nan"] == ["loss"]
    stream.close()


def test_a_start_command_that_cannot_be_built_fails_its_job_and_the_agents_other_starts_go_out(
    coordinator: Coordinator,
) -> None:
    agent_id, stream = coordinator.join("dispatch-agent")
    bad = coordinator.running_job(agent_id, state="ASSIGNED")
    good = coordinator.running_job(agent_id, state="ASSIGNED")
    with coordinator.db.write() as session:  # a damaged row: env values must be strings
        session.execute(update(Job).where(Job.id == bad.job_id).values(env={"BROKEN": 12}))
    before = poison_count("start_task")
    hello(stream, agent_id)
    start = stream.next("start")
    assert start.task_id == good.id
    job = wait_until(
        lambda: (j := coordinator.job(bad.job_id))["state"] == "FAILED" and j, 10, "the bad job to fail"
    )
    assert "task 0 cannot be started: its start command cannot be built (TypeError" in job["reason"], job[
        "reason"
    ]
    assert poison_count("start_task") == before + 1
    stream.close()


# --- loops: one bad row is skipped, every other agent and job is still handled -----------------------------


# What the shared `db` fixture (tests/conftest.py) holds.
pytestmark = pytest.mark.db_seed("e" * 64, agents="abcdefgh")


def submit(db: Database, workers: int = 1, **spec: Any) -> str:
    with db.write() as session:
        job = create_job(
            session, JobCreate(bundle_digest="e" * 64, command=["python", "t.py"], workers=workers, **spec)
        )
        schedule_pending(session)
        return job.id


POISON_OPTIONS = [
    {"startup_timeout_seconds": 1e308},  # OverflowError in datetime arithmetic every tick, before
    {"startup_timeout_seconds": float("inf")},
    {"startup_timeout_seconds": "soon"},
    {"max_runtime_seconds": -5},
    {"max_runtime_seconds": 1e308},
]


def test_reconcile_skips_bad_rows_and_still_detects_lost_agents(db: Database) -> None:
    poisoned = []
    for options in POISON_OPTIONS:
        job_id = submit(db)
        with db.write() as session:
            job = session.get(Job, job_id)
            job.options = {**job.options, **options}
            if "max_runtime_seconds" in options:
                job.state, job.started_at = "RUNNING", utcnow()
        poisoned.append(job_id)
    with db.write() as session:  # a healthy job whose agent stops heartbeating
        victim_id = create_job(
            session, JobCreate(bundle_digest="e" * 64, command=["python", "t.py"], workers=1)
        ).id
        schedule_pending(session)
        victim = session.get(Job, victim_id)
        lost_agent = session.get(Agent, victim.attempts[0].tasks[0].agent_id)
        lost_agent.online_until = utcnow()
    before = poison_count("reconcile_job")
    with db.write() as session:
        reconcile(session, backoff_base_s=1.0, default_startup_timeout_s=120.0)
    with db.read() as session:
        assert session.get(Agent, lost_agent.id).lost_at is not None
        victim = session.get(Job, victim_id)
        assert victim.state == "RESTARTING" and "stopped heartbeating" in victim.reason, victim.reason
        # A limit too large to reach is no limit; the damaged ones are skipped, their jobs untouched.
        assert [session.get(Job, j).state for j in poisoned] == [
            "SCHEDULED",
            "SCHEDULED",
            "SCHEDULED",
            "RUNNING",
            "RUNNING",
        ]
    assert poison_count("reconcile_job") == before + 2  # "soon" and -5


def test_the_scheduler_skips_a_bad_job_and_places_the_others(db: Database) -> None:
    broken = submit(db)
    with db.write() as session:  # a restart whose old task has a state this version does not know
        job = session.get(Job, broken)
        job.state = "RESTARTING"
        job.attempts[0].state = "FAILED"
        job.attempts[0].tasks[0].state = "MYSTERY"
    waiting = submit(db)
    with db.write() as session:
        session.get(Job, waiting).state = "PENDING"  # placed again below, after the broken one
        for task in session.get(Job, waiting).attempts[0].tasks:
            session.delete(task)
        session.delete(session.get(Job, waiting).attempts[0])
    before = poison_count("restart_job")
    with db.write() as session:
        touched = schedule_pending(session)
    assert touched
    with db.read() as session:
        assert session.get(Job, waiting).state == "SCHEDULED"
        assert session.get(Job, broken).state == "RESTARTING"
    assert poison_count("restart_job") == before + 1


def test_a_poisoned_job_does_not_slow_lost_agent_detection_in_the_running_coordinator(tmp_path: Path) -> None:
    """The real loops: a job row with startup_timeout_seconds=1e308 and one with a damaged limit; an agent
    whose heartbeats stop is still declared lost about agent_timeout_s later (it took 38 s instead of 10)."""
    timeout_s = 2.0
    with ExitStack() as stack:
        settings = coordinator_settings(
            tmp_path / "coordinator",
            join_token=JOIN_TOKEN,
            admin_token=ADMIN_TOKEN,
            agent_timeout_s=timeout_s,
        )
        coordinator = Coordinator.start(stack, settings, admin_token=ADMIN_TOKEN)
        agent_id, stream = coordinator.join("short-lived")
        for options in ({"startup_timeout_seconds": 1e308}, {"startup_timeout_seconds": "soon"}):
            coordinator.running_job(agent_id, options, state="ASSIGNED")
        hello(stream, agent_id)
        stream.send(heartbeat=pb.Heartbeat(sent_unix_ms=NOW_MS))
        stream.next("ack", where=lambda a: not a.task_id)
        silent_since = time.monotonic()
        stream.close()

        def lost() -> bool:
            with coordinator.db.read() as session:
                return session.get(Agent, agent_id).lost_at is not None

        wait_until(lost, timeout_s + 8, "the silent agent to be declared lost")
        detected_after = time.monotonic() - silent_since
        print(
            f"lost-agent detection with poisoned jobs: {detected_after:.1f} s (agent timeout {timeout_s} s)"
        )
        assert detected_after < timeout_s + 4


def test_a_damaged_agent_row_does_not_stall_placement(db: Database) -> None:
    with db.write() as session:
        broken = session.scalars(select(Agent).where(Agent.name == "a")).one()
        broken.devices = [{"kind": "cpu", "name": "no index"}]
    before = poison_count("agent_capacity")
    job_id = submit(db, workers=2)
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job.state == "SCHEDULED"
        assert broken.id not in {t.agent_id for t in job.attempts[0].tasks}
    assert poison_count("agent_capacity") == before + 1
