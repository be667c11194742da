"""Issue 10 part 1 and 4, coordinator side, against a real coordinator (gRPC on loopback, SQLite, loops):
a heartbeat writes nothing (liveness lives in memory and is flushed in batches), an agent that goes
silent is still marked lost on time, a change wakes only the agents it concerns, and log and metric
batches of many streams share transactions and are stored exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from mwms.server.db.models import Agent, LogLine, MetricPoint, Task, utcnow
from mwms.server.live.grouped_writes import _Queued
from mwms.server.services.fleet import agent_messages
from mwms.server.services.fleet.agents import record_heartbeats
from mwms.server.services.job_life.tasks import TaskReport
from mwms.server.settings import Settings
from mwms.server.states import TaskState
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.agent_streams import (
    ADMIN_TOKEN,
    JOIN_TOKEN,
    Coordinator,
    hello,
    point,
)
from mwms_testkit.cluster import wait_until
from mwms_testkit.sql_statements import recorded, selects, starting


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Coordinator, Any]]:
    """A coordinator with a 2 s agent timeout, and its app (for the hub, liveness and writer)."""
    with ExitStack() as stack:
        settings = Settings(
            data_dir=tmp_path / "coordinator",
            grpc_port=0,
            join_token=JOIN_TOKEN,
            admin_token=ADMIN_TOKEN,
            agent_timeout_s=2,
            reconnect_grace_s=0,
        )
        coordinator = Coordinator.start(stack, settings, admin_token=ADMIN_TOKEN)
        yield coordinator, coordinator.app


def _agent(coordinator: Coordinator, agent_id: str) -> Agent:
    with coordinator.db.read() as session:
        agent = session.get(Agent, agent_id)
        assert agent is not None
        return agent


def streams_running_a_task(coordinator: Coordinator, prefix: str, count: int) -> list[tuple[Task, Any]]:
    """`count` agents joined, each with a running task it said hello with: (task, stream) of each."""
    streams = []
    for i in range(count):
        agent_id, stream = coordinator.join(f"{prefix}-{i}")
        task = coordinator.running_job(agent_id)
        hello(stream, agent_id, task)
        streams.append((task, stream))
    return streams


def test_heartbeats_write_nothing_and_are_flushed_in_batches(cluster: tuple[Coordinator, Any]) -> None:
    coordinator, app = cluster
    agent_id, stream = coordinator.join("hb-agent")
    hello(stream, agent_id)
    with recorded(coordinator.db.engine, starting("UPDATE AGENTS")) as agent_updates:
        started = time.monotonic()
        for _ in range(100):
            stream.send(heartbeat=pb.Heartbeat(sent_unix_ms=int(time.time() * 1000)))
        for _ in range(100):
            stream.next("ack", where=lambda ack: not ack.task_id)
        elapsed = time.monotonic() - started
    # The reconciler's flush writes every agent seen in one statement about once a second, whatever
    # the number of heartbeats.
    assert len(agent_updates) <= elapsed + 2, (len(agent_updates), elapsed)
    # The flush keeps the database's liveness fresh: the API and a restarted coordinator read it there.
    seen = wait_until(
        lambda: (
            (a := _agent(coordinator, agent_id)).last_heartbeat_at
            and a.last_heartbeat_at.timestamp() > time.time() - 1.5
        ),
        5,
        "a recent last_heartbeat_at in the database",
    )
    assert seen
    stream.close()


def test_a_silent_agent_is_lost_on_time_and_a_heartbeating_one_never(
    cluster: tuple[Coordinator, Any],
) -> None:
    coordinator, _app = cluster
    quiet_id, quiet = coordinator.join("quiet-agent")
    busy_id, busy = coordinator.join("busy-agent")
    hello(quiet, quiet_id)
    hello(busy, busy_id)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            busy.send(heartbeat=pb.Heartbeat(sent_unix_ms=int(time.time() * 1000)))
            stop.wait(0.5)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        silent_since = time.monotonic()
        wait_until(lambda: _agent(coordinator, quiet_id).lost_at is not None, 8, "the quiet agent lost")
        lost_after = time.monotonic() - silent_since
        # Timeout 2 s, reconciler and flush every second: lost within timeout + 2 passes.
        assert lost_after < 2 + 2.5, lost_after
        time.sleep(3)  # well past the timeout: the heartbeating agent stays online
        busy_row = _agent(coordinator, busy_id)
        assert busy_row.lost_at is None
        listed = {a["id"]: a for a in coordinator.http.get("/api/v1/agents").json()}
        assert listed[busy_id]["online"] is True, listed[busy_id]
        assert listed[quiet_id]["online"] is False, listed[quiet_id]
    finally:
        stop.set()
        beater.join()
        quiet.close()
        busy.close()


def test_a_failed_task_sends_stops_only_to_its_gang(
    cluster: tuple[Coordinator, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator, app = cluster
    joined = [coordinator.join(f"gang-agent-{i}") for i in range(3)]
    (a_id, a), (b_id, b), (idle_id, idle) = joined
    task_a = coordinator.running_job(a_id)
    with coordinator.db.write() as session:  # a second worker of the same attempt on agent b
        task_b = Task(
            job_id=task_a.job_id,
            attempt_id=task_a.attempt_id,
            attempt_number=1,
            index=1,
            agent_id=b_id,
            host="127.0.0.1",
            port=21001,
            device_kind="cpu",
            device_indices=[0],
            state="RUNNING",
        )
        session.add(task_b)
        session.flush()
    hello(a, a_id, task_a)
    hello(b, b_id, task_b)
    hello(idle, idle_id)
    hub = app.state.wiring.hub
    asked: list[list[str]] = []
    real = agent_messages.pending_commands

    def spy(session: Any, agent_ids: list[str]) -> Any:
        asked.append(list(agent_ids))
        return real(session, agent_ids)

    monkeypatch.setattr(agent_messages, "pending_commands", spy)
    time.sleep(1.5)  # hellos dispatched; idle heartbeats and reconciler passes must not dispatch
    asked.clear()
    passes = hub.passes
    for _ in range(3):
        for _agent_id, stream in joined:
            stream.send(heartbeat=pb.Heartbeat(sent_unix_ms=int(time.time() * 1000)))
        time.sleep(0.5)
    assert hub.passes == passes, asked  # no polling
    a.send(task=pb.TaskReport(task_id=task_a.id, state=pb.TASK_STATE_FAILED, exit_code=1))
    stop = b.next("stop", timeout=5, where=lambda s: s.task_id == task_b.id)
    assert stop.task_id == task_b.id
    assert asked and all(idle_id not in ids for ids in asked), asked
    for _agent_id, stream in joined:
        stream.close()


def test_telemetry_of_many_streams_shares_transactions_and_is_stored_once(
    cluster: tuple[Coordinator, Any],
) -> None:
    coordinator, app = cluster
    writer = app.state.wiring.telemetry
    streams = streams_running_a_task(coordinator, "ingest-agent", 4)
    transactions = writer.transactions
    batches = 0
    for round_ in range(10):
        for task, stream in streams:
            seqs = range(round_ * 100 + 1, round_ * 100 + 101)
            stream.send(metrics=pb.MetricBatch(task_id=task.id, points=[point(s, s, float(s)) for s in seqs]))
            lines = [
                pb.LogLine(seq=s, stream="stdout", text=f"line {s}", unix_ms=1764500000000) for s in seqs
            ]
            stream.send(logs=pb.LogBatch(task_id=task.id, lines=lines))
            # As the agent does: on a slow machine the rounds outlast the fixture's 2 s agent timeout, and
            # agents judged lost restarted their jobs before the acks came (a clean-clone CI, 2026-12-07).
            stream.send(heartbeat=pb.Heartbeat(sent_unix_ms=int(time.time() * 1000)))
            batches += 2
    for task, stream in streams:
        stream.acked(task.id, log_seq=1000, metric_seq=1000)
    # A resend (its ack was lost) stores nothing twice; alone in flight, it gets an Ack of its own.
    task, stream = streams[0]
    stream.send(
        metrics=pb.MetricBatch(task_id=task.id, points=[point(s, s, float(s)) for s in range(1, 101)])
    )
    batches += 1
    stream.next("ack", where=lambda ack: ack.metric_seq == 100)
    with coordinator.db.read() as session:
        for task, _stream in streams:
            points = session.scalar(select(func.count()).where(MetricPoint.task_id == task.id))
            distinct = session.scalar(
                select(func.count(func.distinct(MetricPoint.seq))).where(MetricPoint.task_id == task.id)
            )
            lines = session.scalar(select(func.count()).where(LogLine.task_id == task.id))
            assert (points, distinct, lines) == (1000, 1000, 1000), task.id
    assert writer.transactions - transactions < batches, (writer.transactions - transactions, batches)
    for _task, stream in streams:
        stream.close()


def test_a_flush_never_moves_liveness_back_behind_a_registration(cluster: tuple[Coordinator, Any]) -> None:
    """An agent heard from, then restarted and registered again before the flush: the older sighting
    must not shorten the registration's online_until (the agent would be lost while reconnecting)."""
    coordinator, app = cluster
    agent_id, stream = coordinator.join("restarting-agent")
    stream.close()
    older = utcnow() - timedelta(seconds=5)
    with coordinator.db.write() as session:
        registered = session.get(Agent, agent_id)
        assert registered is not None
        kept = (registered.last_heartbeat_at, registered.online_until)
        record_heartbeats(session, {agent_id: older}, timeout_s=2)
    row = _agent(coordinator, agent_id)
    assert (row.last_heartbeat_at, row.online_until) == kept
    newer = utcnow() + timedelta(seconds=1)
    with coordinator.db.write() as session:
        record_heartbeats(session, {agent_id: newer}, timeout_s=2)
    row = _agent(coordinator, agent_id)
    assert (row.last_heartbeat_at, row.online_until) == (newer, newer + timedelta(seconds=2))


def test_telemetry_transactions_are_sized_to_hold_the_write_lock_briefly() -> None:
    from mwms.server.live.ingest import (
        MAX_ITEMS_PER_TRANSACTION,
        MIN_ITEMS_PER_TRANSACTION,
        TARGET_TRANSACTION_S,
        items_per_transaction,
    )

    # A fast database keeps the largest transactions; a slow one gets transactions of about the target's length.
    assert items_per_transaction(50_000, 0.1) == MAX_ITEMS_PER_TRANSACTION
    assert items_per_transaction(30_000, 1.0) == int(30_000 * TARGET_TRANSACTION_S)
    # Never so small that per-transaction costs dominate, and nothing measured yet means no bound but the largest.
    assert items_per_transaction(1_000, 10.0) == MIN_ITEMS_PER_TRANSACTION
    assert items_per_transaction(0, 0.0) == MAX_ITEMS_PER_TRANSACTION


def _group(items: list[tuple[str, Any]]) -> list[Any]:
    """Items as a grouped writer queues them (server/live/grouped_writes.py), for its `_write`."""
    loop = asyncio.new_event_loop()
    try:
        return [_Queued(agent_id, item, loop.create_future()) for agent_id, item in items]
    finally:
        loop.close()


def test_hellos_and_reports_of_a_transaction_read_their_rows_once(cluster: tuple[Coordinator, Any]) -> None:
    """Hundreds of hellos arrive together after a replica dies or the coordinator restarts, a gang's reports
    within a second: each item read its agent (a hello twice), its task, attempt and job one by one, a round
    trip each on PostgreSQL (1,000 hellos: 2.0 s, 7 statements each; now 1.0 s, 4). The group's rows are
    read in one query a table, and every item is applied as it would be alone."""
    coordinator, app = cluster
    wiring = app.state.wiring
    joined = [coordinator.join(f"hello-group-{i}")[0] for i in range(12)]
    # Two of them run a task: one says so in its hello, the other restarted and no longer knows its own.
    kept, forgotten = coordinator.running_job(joined[3]), coordinator.running_job(joined[7])
    kept_report = TaskReport(task_id=kept.id, state=TaskState.RUNNING, pid=4242)
    hellos = [(agent_id, [kept_report] if agent_id == joined[3] else []) for agent_id in joined]
    # This thread's statements only: the coordinator answers the streams' own calls meanwhile.
    here = threading.current_thread().name
    with recorded(coordinator.db.engine, starting("SELECT", "UPDATE"), threads=here) as statements:
        outcomes, _ = wiring.hellos._write(_group(hellos))
    assert all(isinstance(o, tuple) and o[1] >= 1 for o in outcomes), outcomes  # each stream's epoch
    by_key = [s.lstrip().upper() for s in statements]
    assert sum(1 for s in by_key if s.startswith("SELECT AGENTS")) == 1, statements
    # Liveness and the stream's holder written together: one UPDATE an agent.
    assert sum(1 for s in by_key if s.startswith("UPDATE AGENTS")) == 12, statements
    # Which agents run tasks: one query; the tasks of each of those two alone are read again.
    assert sum(1 for s in by_key if s.startswith("SELECT DISTINCT TASKS.AGENT_ID")) == 1, statements
    assert sum(1 for s in by_key if s.startswith("SELECT TASKS.ID,") and "TASKS.AGENT_ID = ?" in s) == 2
    with coordinator.db.read() as session:
        rows = session.scalars(select(Agent).where(Agent.id.in_(joined))).all()
        assert {a.stream_replica for a in rows} == {wiring.replica.id}
        assert all(a.online_until is not None and a.online_until > utcnow() for a in rows)
        assert session.get(Task, kept.id).state == "RUNNING"
        lost = session.get(Task, forgotten.id)
        assert lost.state == "LOST" and "no longer runs it" in lost.message, (lost.state, lost.message)

    streams = streams_running_a_task(coordinator, "report-group", 6)
    reports = [
        (task.agent_id, TaskReport(task_id=task.id, state=TaskState.SUCCEEDED, exit_code=0, pid=4242))
        for task, _ in streams
    ]
    with recorded(coordinator.db.engine, selects, threads=here) as statements:
        outcomes, _ = wiring.reports._write(_group(reports))
    assert all(isinstance(o, agent_messages.Replies) and o.final_acks for o in outcomes), outcomes
    by_key = [s.lstrip().upper() for s in statements]
    assert sum(1 for s in by_key if s.startswith("SELECT AGENTS")) == 1, statements
    assert sum(1 for s in by_key if s.startswith("SELECT TASKS") and "TASKS.ID IN" in s) == 1, statements
    # Their attempts and jobs too: none read by id, report by report.
    for table in ("ATTEMPTS", "JOBS"):
        assert sum(1 for s in by_key if s.startswith(f"SELECT {table}.ID,") and f"{table}.ID IN" in s) == 1
        assert not [s for s in by_key if s.startswith(f"SELECT {table}.") and f"{table}.ID = ?" in s], (
            statements
        )
    with coordinator.db.read() as session:
        states = session.scalars(select(Task.state).where(Task.id.in_([t.id for t, _ in streams]))).all()
    assert sorted(states) == ["SUCCEEDED"] * 6
    for _task, stream in streams:
        stream.close()


def test_task_reports_of_many_streams_share_transactions_and_each_is_answered(
    cluster: tuple[Coordinator, Any],
) -> None:
    """A gang's agents report at once: their reports share transactions (server/live/report_writer.py), each
    applied as it would be alone: the known tasks end, a task the coordinator does not know is stopped."""
    coordinator, app = cluster
    writer = app.state.wiring.reports
    streams = streams_running_a_task(coordinator, "reporting-agent", 8)
    transactions = writer.transactions
    for task, stream in streams:
        stream.send(task=pb.TaskReport(task_id=task.id, state=pb.TASK_STATE_SUCCEEDED, exit_code=0, pid=4242))
    unknown = "0" * 32
    streams[0][1].send(task=pb.TaskReport(task_id=unknown, state=pb.TASK_STATE_RUNNING, pid=4243))
    for task, stream in streams:
        stream.next("ack", where=lambda ack, t=task: ack.task_id == t.id and ack.final_state)
    streams[0][1].next("stop", where=lambda stop: stop.task_id == unknown)
    with coordinator.db.read() as session:
        states = session.scalars(select(Task.state).where(Task.id.in_([t.id for t, _ in streams]))).all()
    assert sorted(states) == ["SUCCEEDED"] * 8
    assert writer.transactions - transactions < 9, (writer.transactions - transactions, 9)
    for _task, stream in streams:
        stream.close()
