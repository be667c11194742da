"""Issue 33 item 3: log lines and metric points are stored by the ingest process (server/ingest_worker.py),
not by the coordinator's own interpreter; a killed ingest process is started again and nothing
acknowledged is lost or stored twice. A real coordinator (its gRPC server on loopback, SQLite, its ingest
process as a real child process) fed over real Connect streams; processes are killed with SIGKILL.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from mwms.server.db.models import LogLine, MetricPoint
from mwms.server.live import ingest_process
from mwms.server.live.ingest_process import IngestProcess
from mwms.server.live.ingest_store import ThreadStore
from mwms.server.settings import Settings
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.agent_streams import ADMIN_TOKEN, JOIN_TOKEN, Coordinator, hello, point
from mwms_testkit.cluster import wait_until
from mwms_testkit.sql_statements import recorded, starting


def start(stack: ExitStack, tmp_path: Path, **values: Any) -> Coordinator:
    settings = Settings(
        data_dir=tmp_path / "coordinator",
        grpc_port=0,
        join_token=JOIN_TOKEN,
        admin_token=ADMIN_TOKEN,
        agent_timeout_s=300,
        **values,
    )
    return Coordinator.start(stack, settings, admin_token=ADMIN_TOKEN)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    with ExitStack() as stack:
        yield start(stack, tmp_path)


def ingest_of(coordinator: Coordinator) -> IngestProcess:
    store = coordinator.app.state.wiring.telemetry.store
    assert isinstance(store, IngestProcess), store
    return store


def metric_batch(task_id: str, first: int, count: int) -> pb.MetricBatch:
    return pb.MetricBatch(task_id=task_id, points=[point(s, s, 1.0 / s) for s in range(first, first + count)])


def log_batch(task_id: str, first: int, count: int) -> pb.LogBatch:
    lines = [
        pb.LogLine(seq=s, stream="stdout", text=f"line {s}", unix_ms=1764500000000)
        for s in range(first, first + count)
    ]
    return pb.LogBatch(task_id=task_id, lines=lines)


def stored(coordinator: Coordinator, task_id: str) -> dict[str, tuple[int, int]]:
    """Rows and distinct seqs of each kind stored for `task_id`."""
    counts = {}
    with coordinator.db.read() as session:
        for kind, model in (("metrics", MetricPoint), ("logs", LogLine)):
            counts[kind] = (
                session.scalar(select(func.count()).where(model.task_id == task_id)),
                session.scalar(select(func.count(func.distinct(model.seq))).where(model.task_id == task_id)),
            )
    return counts


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def test_telemetry_is_stored_by_the_ingest_process_and_not_in_the_coordinator(
    coordinator: Coordinator,
) -> None:
    telemetry = starting("INSERT INTO METRIC_POINTS", "INSERT INTO LOG_LINES")
    with recorded(coordinator.db.engine, telemetry) as inserts:
        agent_id, stream = coordinator.join("ingest-agent")
        task = coordinator.running_job(agent_id)
        hello(stream, agent_id, task)
        for round_ in range(5):
            stream.send(metrics=metric_batch(task.id, round_ * 100 + 1, 100))
            stream.send(logs=log_batch(task.id, round_ * 100 + 1, 100))
        stream.acked(task.id, log_seq=500, metric_seq=500)

    store = ingest_of(coordinator)
    assert store.pid is not None and store.starts == 1
    assert b"mwms.server.ingest_worker" in cmdline(store.pid)
    assert int(Path(f"/proc/{store.pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
    assert stored(coordinator, task.id) == {"metrics": (500, 500), "logs": (500, 500)}
    assert inserts == [], "the coordinator's own connections stored telemetry"
    stream.close()


def test_without_the_ingest_process_telemetry_is_stored_in_a_thread(tmp_path: Path) -> None:
    with ExitStack() as stack:
        coordinator = start(stack, tmp_path, ingest_process=False)
        assert isinstance(coordinator.app.state.wiring.telemetry.store, ThreadStore)
        agent_id, stream = coordinator.join("in-process-agent")
        task = coordinator.running_job(agent_id)
        hello(stream, agent_id, task)
        stream.send(metrics=metric_batch(task.id, 1, 50))
        stream.send(logs=log_batch(task.id, 1, 50))
        stream.acked(task.id, log_seq=50, metric_seq=50)
        assert stored(coordinator, task.id) == {"metrics": (50, 50), "logs": (50, 50)}
        stream.close()


def test_a_killed_ingest_process_is_started_again_and_nothing_acknowledged_is_lost_or_stored_twice(
    coordinator: Coordinator,
) -> None:
    """SIGKILL at whatever moment the kills land: before a group is read, while it is stored, after its
    commit and before its answer. The stream lives on; every batch is acknowledged, none refused."""
    store = ingest_of(coordinator)
    agent_id, stream = coordinator.join("storm-agent")
    task = coordinator.running_job(agent_id)
    hello(stream, agent_id, task)
    rounds, size, kills = 100, 50, 4  # at least `rounds`, and until every kill landed
    killed: list[int] = []

    def kill_storm() -> None:
        # Each kill a while into a new process's life, once it has answered something: a group is charged
        # with the death of the process storing it, and one charged twice would be split up.
        answered = store.answered
        while len(killed) < kills:
            pid = store.pid
            if pid is None or pid in killed or store.answered == answered:
                time.sleep(0.005)
                continue
            time.sleep(0.05 + 0.05 * len(killed))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            answered = store.answered

    killer = threading.Thread(target=kill_storm, daemon=True)
    killer.start()
    round_ = 0
    deadline = time.monotonic() + 60
    while (round_ < rounds or len(killed) < kills) and time.monotonic() < deadline:
        stream.send(metrics=metric_batch(task.id, round_ * size + 1, size))
        stream.send(logs=log_batch(task.id, round_ * size + 1, size))
        round_ += 1
        time.sleep(0.01)  # streaming on while the kills land
    last = round_ * size
    acks = stream.acked(task.id, log_seq=last, metric_seq=last, timeout=60)
    killer.join(30)

    assert len(killed) == kills and store.starts >= kills, (killed, store.starts)
    assert all(ack.rejected == 0 for ack in acks)
    assert stored(coordinator, task.id) == {"metrics": (last, last), "logs": (last, last)}
    # The process now running stores on: the stream needed no reconnect.
    stream.send(metrics=metric_batch(task.id, last + 1, 10))
    stream.next("ack", where=lambda a: a.metric_seq == last + 10)
    stream.close()


def test_a_group_committed_whose_answer_was_lost_is_stored_again_once_and_its_change_still_acts(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process commits a group (here: a NaN that fails the job), then dies before its answer arrives.
    The next process stores the group again: nothing twice, the ack comes, and the job's failure still
    reaches the agent (a stop), although the second storing changed nothing."""
    store = ingest_of(coordinator)
    agent_id, stream = coordinator.join("lost-answer-agent")
    task = coordinator.running_job(agent_id, {"restart": {"max_restarts": 3, "fail_on_nan": ["loss"]}})
    hello(stream, agent_id, task)
    stream.send(metrics=metric_batch(task.id, 1, 10))
    stream.next("ack", where=lambda a: a.metric_seq == 10)
    committed_before_loss: list[dict[str, tuple[int, int]]] = []
    decode_reply = ingest_process.decode_reply

    def lose_the_first_answer(body: bytes) -> Any:
        if not committed_before_loss:
            committed_before_loss.append(stored(coordinator, task.id))
            pid = store.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            raise ingest_process.FrameError("the answer was lost")
        return decode_reply(body)

    monkeypatch.setattr(ingest_process, "decode_reply", lose_the_first_answer)
    points = [point(s, s, 0.5) for s in range(11, 20)] + [point(20, 20, math.nan)]
    stream.send(metrics=pb.MetricBatch(task_id=task.id, points=points))
    ack = stream.next("ack", timeout=30, where=lambda a: a.metric_seq == 20)
    assert ack.rejected == 0
    assert committed_before_loss == [{"metrics": (20, 20), "logs": (0, 0)}]  # the first process committed it
    assert stored(coordinator, task.id) == {"metrics": (20, 20), "logs": (0, 0)}
    assert store.starts == 2
    stop = stream.next("stop", timeout=30, where=lambda s: s.task_id == task.id)
    assert "NaN at step 20" in stop.reason
    assert coordinator.job(task.job_id)["state"] == "FAILED"
    stream.close()


def test_a_batch_that_kills_the_ingest_process_each_time_is_refused_and_the_stream_goes_on(
    coordinator: Coordinator,
) -> None:
    """Each process that stores the batch dies (killed while it waits for the write lock the test holds):
    after TRIES deaths the batch is refused with why, and the stream goes on."""
    store = ingest_of(coordinator)
    agent_id, stream = coordinator.join("poison-agent")
    task = coordinator.running_job(agent_id)
    hello(stream, agent_id, task)
    stream.send(metrics=metric_batch(task.id, 1, 5))
    stream.next("ack", where=lambda a: a.metric_seq == 5)
    killed: list[int] = []
    lock = sqlite3.connect(coordinator.db.engine.url.database, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the process storing the batch waits here until it is killed
    try:
        stream.send(metrics=metric_batch(task.id, 6, 5))
        while len(killed) < ingest_process.TRIES:
            wait_until(lambda: store.ready and store.unanswered and store.pid not in killed, 30, "storing")
            pid = store.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        refused = stream.next("ack", timeout=30, where=lambda a: a.metric_seq == 10)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert refused.rejected == 5, refused
    assert "the ingest process died" in refused.reject_reason
    # The next batch is stored by a process that lives.
    stream.send(metrics=metric_batch(task.id, 11, 5))
    assert stream.next("ack", timeout=30, where=lambda a: a.metric_seq == 15).rejected == 0
    with coordinator.db.read() as session:
        seqs = set(session.scalars(select(MetricPoint.seq).where(MetricPoint.task_id == task.id)))
    assert seqs == {*range(1, 6), *range(11, 16)}
    stream.close()


def test_an_ingest_process_whose_coordinator_died_stops_quietly(tmp_path: Path) -> None:
    """A coordinator killed while its ingest process answers: the reply meets a closed pipe. The process
    stops with status 0 and one line saying why, not a traceback logged as CRITICAL."""
    worker = subprocess.Popen(
        [sys.executable, "-m", ingest_process.MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdout.close()  # the coordinator's end of the replies, gone
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    worker.stdin.write(json.dumps({"url": url}).encode() + b"\n")  # its first reply is READY
    worker.stdin.flush()
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr and b"CRITICAL" not in stderr, stderr.decode()
    assert b"stopped reading the ingest process's replies" in stderr
