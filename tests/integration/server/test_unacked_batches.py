"""Issue 16 item 9e: log batches count against the same bound on unacknowledged batches as metric batches
(MAX_UNACKED_BATCHES per stream, both kinds together, one code path), and a task report never overtakes
the batches sent before it, on a real coordinator: its gRPC server on loopback, a real Connect stream,
SQLite, its ingest process, and its telemetry writer held back by the test.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from mwms.server.db.models import LogLine, MetricPoint
from mwms.server.rpc.agent_stream import MAX_UNACKED_BATCHES
from mwms.server.settings import Settings
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.agent_streams import ADMIN_TOKEN, JOIN_TOKEN, Coordinator, hello, point
from mwms_testkit.cluster import wait_until


@contextmanager
def coordinator_held_back(
    tmp_path: Path, agent_timeout_s: float
) -> Iterator[tuple[Coordinator, threading.Event, list[Any]]]:
    """A coordinator whose telemetry writer stores nothing until the event is set; and what was submitted."""
    with ExitStack() as stack:
        settings = Settings(
            data_dir=tmp_path / "coordinator",
            grpc_port=0,
            join_token=JOIN_TOKEN,
            admin_token=ADMIN_TOKEN,
            agent_timeout_s=agent_timeout_s,
        )
        coordinator = Coordinator.start(stack, settings, admin_token=ADMIN_TOKEN)
        writer = coordinator.app.state.wiring.telemetry
        release = threading.Event()
        stack.callback(release.set)  # never leave the writer waiting at teardown
        submitted: list[Any] = []
        store, submit = writer.store.store, writer.submit

        async def held_store(batches: list[Any]) -> Any:
            # Whichever store runs the transactions (the ingest process, or a thread).
            await asyncio.to_thread(release.wait, 30)
            return await store(batches)

        def counted_submit(batch: Any) -> Any:
            submitted.append(batch)
            return submit(batch)

        writer.store.store, writer.submit = held_store, counted_submit
        yield coordinator, release, submitted


@pytest.fixture
def held_back(tmp_path: Path) -> Iterator[tuple[Coordinator, threading.Event, list[Any]]]:
    with coordinator_held_back(tmp_path, agent_timeout_s=300) as held:
        yield held


def log_batch(task_id: str, first: int, count: int) -> pb.LogBatch:
    lines = [
        pb.LogLine(seq=s, stream="stdout", text=f"line {s}", unix_ms=1764500000000)
        for s in range(first, first + count)
    ]
    return pb.LogBatch(task_id=task_id, lines=lines)


def still(read: Any, value: Any, seconds: float) -> bool:
    """True when `read()` keeps returning `value` for `seconds` (no growth past a bound can be awaited)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if read() != value:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("kinds", [("logs",), ("logs", "metrics")])
def test_log_batches_wait_for_acknowledgements_as_metric_batches_do(held_back, kinds) -> None:
    coordinator, release, submitted = held_back
    agent_id, stream = coordinator.join("chatty-agent")
    task = coordinator.running_job(agent_id)
    hello(stream, agent_id, task)
    rounds = MAX_UNACKED_BATCHES * 2
    for i in range(rounds):
        if "logs" in kinds:
            stream.send(logs=log_batch(task.id, i * 10 + 1, 10))
        if "metrics" in kinds:
            stream.send(metrics=pb.MetricBatch(task_id=task.id, points=[point(i + 1, i, float(i))]))
    sent = rounds * len(kinds)

    # The writer holds everything back: the stream hands over the bound's worth, then stops reading.
    wait_until(lambda: len(submitted) >= MAX_UNACKED_BATCHES, 10, f"{MAX_UNACKED_BATCHES} batches submitted")
    assert still(lambda: len(submitted), MAX_UNACKED_BATCHES, 0.5), len(submitted)
    assert sent > MAX_UNACKED_BATCHES

    release.set()  # then every batch is stored once and acknowledged, in order
    acks: list[Any] = []  # one Ack may acknowledge both kinds (batches stored in one transaction)

    def all_acknowledged(ack: Any) -> bool:
        acks.append(ack)
        logs_done = "logs" not in kinds or max(a.log_seq for a in acks) == rounds * 10
        return logs_done and ("metrics" not in kinds or max(a.metric_seq for a in acks) == rounds)

    stream.next("ack", where=lambda a: a.task_id == task.id and all_acknowledged(a))
    assert all(a.rejected == 0 for a in acks)
    assert len(submitted) == sent
    with coordinator.db.read() as session:
        lines = session.scalar(select(func.count()).where(LogLine.task_id == task.id))
        points = session.scalar(select(func.count()).where(MetricPoint.task_id == task.id))
    assert lines == (rounds * 10 if "logs" in kinds else 0)
    assert points == (rounds if "metrics" in kinds else 0)
    # The stream lives on: a heartbeat is answered at once.
    stream.send(heartbeat=pb.Heartbeat(sent_unix_ms=1764500000000))
    stream.next("ack", where=lambda a: not a.task_id)
    stream.close()


@pytest.fixture
def held_back_short_timeout(tmp_path: Path) -> Iterator[tuple[Coordinator, threading.Event, list[Any]]]:
    """The same with a 2 s agent timeout: a reader waiting on the writer must not age its agent into lost."""
    with coordinator_held_back(tmp_path, agent_timeout_s=2) as held:
        yield held


def test_an_agent_whose_stream_waits_on_a_slow_writer_stays_alive(held_back_short_timeout) -> None:
    """Found by bench/replicas.py's kill storm: agents streaming metrics on a replica whose writer lagged were
    marked lost, their heartbeats unread behind the backpressure, while the replica itself beat on."""
    from mwms.server.db.models import Agent

    coordinator, release, _ = held_back_short_timeout
    agent_id, stream = coordinator.join("patient-agent")
    task = coordinator.running_job(agent_id)
    hello(stream, agent_id, task)
    for i in range(MAX_UNACKED_BATCHES + 5):
        stream.send(metrics=pb.MetricBatch(task_id=task.id, points=[point(i + 1, i, float(i))]))
    time.sleep(4)  # twice the agent timeout, the reader blocked on the writer all along
    with coordinator.db.read() as session:
        agent = session.get(Agent, agent_id)
        assert agent.lost_at is None, "marked lost while it waited on the coordinator"
    release.set()
    stream.next("ack", where=lambda a: a.metric_seq == MAX_UNACKED_BATCHES + 5)
    stream.close()


def test_a_final_report_is_applied_after_the_lines_sent_before_it(held_back) -> None:
    """Found in CI on 2 loaded cores: the coordinator applied a task's FAILED report while the telemetry
    writer still held the task's last lines, so the failure's reason quoted lines from seconds before."""
    coordinator, release, submitted = held_back
    agent_id, stream = coordinator.join("failing-agent")
    task = coordinator.running_job(agent_id, options={"restart": {"max_restarts": 0}})
    hello(stream, agent_id, task)
    stream.send(logs=log_batch(task.id, 1, 3))
    stream.send(
        logs=pb.LogBatch(
            task_id=task.id,
            lines=[pb.LogLine(seq=4, stream="stderr", text="boom: the last line", unix_ms=1764500000000)],
        )
    )
    stream.send(task=pb.TaskReport(task_id=task.id, state=pb.TASK_STATE_FAILED, exit_code=3, pid=4242))
    wait_until(lambda: len(submitted) == 2, 10, "both batches handed to the writer")
    # The writer still holds both batches: the report waits behind them, so nothing has ended yet.
    assert still(lambda: coordinator.job(task.job_id)["state"], "RUNNING", 0.5)

    release.set()
    wait_until(lambda: coordinator.job(task.job_id)["state"] == "FAILED", 10, "the job failed")
    reason = coordinator.job(task.job_id)["reason"]
    assert reason.endswith("line 3\nboom: the last line"), reason
    stream.close()


def test_batches_stored_together_are_acknowledged_in_one_ack_per_task(held_back) -> None:
    """Ten log and ten metric batches of one task, held by the writer, then stored in at most three
    transactions (two were formed while it held): each transaction's batches get one Ack with both seqs,
    not one per batch, and every item is acknowledged and stored."""
    coordinator, release, submitted = held_back
    agent_id, stream = coordinator.join("streaming-agent")
    task = coordinator.running_job(agent_id)
    hello(stream, agent_id, task)
    rounds = 10
    for i in range(rounds):
        stream.send(logs=log_batch(task.id, i * 10 + 1, 10))
        stream.send(metrics=pb.MetricBatch(task_id=task.id, points=[point(i + 1, i, float(i))]))
    wait_until(lambda: len(submitted) == 2 * rounds, 10, "every batch handed to the writer")

    release.set()
    acks: list[Any] = []

    def all_acknowledged(ack: Any) -> bool:
        if ack.task_id == task.id:
            acks.append(ack)
        return bool(acks) and (
            max(a.log_seq for a in acks) == rounds * 10 and max(a.metric_seq for a in acks) == rounds
        )

    stream.next("ack", where=all_acknowledged)
    assert len(acks) <= 3, [(a.log_seq, a.metric_seq) for a in acks]
    assert any(a.log_seq and a.metric_seq for a in acks)
    assert all(a.rejected == 0 for a in acks)
    # Each Ack covers everything up to its seqs: they only grow.
    assert [a.log_seq for a in acks if a.log_seq] == sorted(a.log_seq for a in acks if a.log_seq)
    with coordinator.db.read() as session:
        assert session.scalar(select(func.count()).where(LogLine.task_id == task.id)) == rounds * 10
        assert session.scalar(select(func.count()).where(MetricPoint.task_id == task.id)) == rounds
    stream.close()
