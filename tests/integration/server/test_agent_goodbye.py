"""A cleanly stopped agent is not lost: its Goodbye, over a real Connect stream to a real in-process
coordinator (gRPC on loopback, SQLite, the real loops), makes it read as stopped; the timeout passes and it
stays stopped, while an agent that went silent without a word is lost; a later hello brings it back. And
the same rules on the services over a real SQLite database: the reconciler, liveness flushes, placement and
the gauges.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job, Task, utcnow
from mwms.server.observability.lost_agents import lost_agent_names
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agent_messages import MAX_GOODBYE_REASON, accept_goodbye, goodbye_reason
from mwms.server.services.fleet.agents import (
    Registration,
    agent_state,
    capacities,
    record_heartbeats,
    register_agent,
)
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.services.observing.cluster_counts import count_cluster
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.cluster import wait_until
from mwms_testkit.coordinator_rows import register_request
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

JOIN_TOKEN = "join-token-for-goodbye-tests-0123456789ab"
ADMIN_TOKEN = "mwms_admin-token-for-goodbye-tests-01234"
AGENT_TIMEOUT_S = 2.0
BACKOFF = 1.0


class Stream:
    """A Connect stream driven by the test: `send` queues agent messages; `half_close` ends what the agent
    sends, as the agent does after its Goodbye; `ended` is set once the coordinator ended the call."""

    def __init__(self, coordinator: InProcessCoordinator, credential: str) -> None:
        self._out: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        self.received: list[pb.CoordinatorMessage] = []
        self.ended = threading.Event()
        self.error: grpc.RpcError | None = None
        self.call = coordinator.stub.Connect(
            iter(self._out.get, None), metadata=(("authorization", f"Bearer {credential}"),)
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.received.append(message)
        except grpc.RpcError as error:
            self.error = error
        finally:
            self.ended.set()

    def send(self, **body: Any) -> None:
        self._out.put(pb.AgentMessage(**body))

    def half_close(self) -> None:
        self._out.put(None)

    def cancel(self) -> None:
        self._out.put(None)
        self.call.cancel()


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[InProcessCoordinator]:
    with ExitStack() as stack:
        settings = coordinator_settings(
            tmp_path / "coordinator",
            join_token=JOIN_TOKEN,
            admin_token=ADMIN_TOKEN,
            agent_timeout_s=AGENT_TIMEOUT_S,
        )
        yield InProcessCoordinator.start(stack, settings, admin_token=ADMIN_TOKEN)


def join(coordinator: InProcessCoordinator, name: str, port_low: int) -> tuple[str, str, Stream]:
    """Registers `name`, opens its stream and says hello; (agent id, credential, stream)."""
    response = coordinator.stub.Register(register_request(name, JOIN_TOKEN, port_low=port_low), timeout=10)
    stream = Stream(coordinator, response.credential)
    stream.send(hello=pb.Hello(agent_id=response.agent_id))
    return response.agent_id, response.credential, stream


def row(coordinator: InProcessCoordinator, agent_id: str) -> Agent:
    with coordinator.db.read() as session:
        agent = session.get(Agent, agent_id)
        assert agent is not None
        return agent


def listed(coordinator: InProcessCoordinator, name: str) -> dict[str, Any]:
    response = coordinator.http.get("/api/v1/agents")
    assert response.status_code == 200, response.text
    return next(a for a in response.json() if a["name"] == name)


def gauges(coordinator: InProcessCoordinator) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = coordinator.http.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name in ("mwms_agents", "mwms_agent_lost")
    }


def test_a_goodbye_reads_as_stopped_past_the_timeout_and_a_later_hello_brings_the_agent_back(
    coordinator: InProcessCoordinator,
) -> None:
    assert gauges(coordinator)[("mwms_agents", frozenset({("state", "stopped")}))] == 0

    stopping_id, credential, stopping = join(coordinator, "stopping", 21000)
    silent_id, _, silent = join(coordinator, "silent", 21100)
    wait_until(lambda: row(coordinator, stopping_id).stream_replica, 10, "the hello of the stopping agent")
    # Unprintable characters and a reason far past the bound: what the coordinator logs is cleaned and cut.
    stopping.send(goodbye=pb.Goodbye(reason="systemctl stop\x1b[31m" + "x" * 1000))
    stopping.half_close()
    assert stopping.ended.wait(10), "the coordinator did not end the call after the goodbye"
    assert stopping.error is None, stopping.error  # ended cleanly (OK), not aborted
    silent.cancel()  # a second agent that goes away without a word, at the same time

    agent = row(coordinator, stopping_id)
    assert agent.stopped_at is not None and agent.lost_at is None and agent.stream_replica is None
    assert agent.online_until is not None and agent.online_until <= utcnow()
    shown = listed(coordinator, "stopping")
    assert (shown["state"], shown["online"], shown["lost_at"]) == ("stopped", False, None)
    assert shown["stopped_at"] is not None

    # The silent agent is lost once the timeout passes; by then the stopped one would have been too.
    wait_until(lambda: row(coordinator, silent_id).lost_at, AGENT_TIMEOUT_S + 10, "the silent agent lost")
    agent = row(coordinator, stopping_id)
    assert agent.lost_at is None and agent.stopped_at is not None
    assert listed(coordinator, "stopping")["state"] == "stopped"
    assert listed(coordinator, "silent")["state"] == "lost"
    metrics = gauges(coordinator)
    assert metrics[("mwms_agents", frozenset({("state", "stopped")}))] == 1
    assert metrics[("mwms_agents", frozenset({("state", "lost")}))] == 1
    lost = {dict(labels)["agent"] for name, labels in metrics if name == "mwms_agent_lost"}
    assert lost == {"silent"}
    overview = coordinator.http.get("/api/v1/overview").json()
    assert (overview["agents_lost"], overview["agents_stopped"]) == (1, 1)

    # The agent starts again: its hello on a new stream clears stopped_at (no registration needed).
    again = Stream(coordinator, credential)
    again.send(hello=pb.Hello(agent_id=stopping_id))
    wait_until(lambda: row(coordinator, stopping_id).stopped_at is None, 10, "the hello to clear stopped_at")
    shown = listed(coordinator, "stopping")
    assert (shown["state"], shown["online"], shown["stopped_at"]) == ("online", True, None)
    again.cancel()


def test_the_goodbye_reason_is_printable_and_bounded() -> None:
    assert goodbye_reason("systemctl stop") == "systemctl stop"
    assert goodbye_reason("") == "no reason given"
    cleaned = goodbye_reason("bye\x1b[31m\n" + "x" * 1000)
    assert cleaned.startswith("bye?[31m?x") and cleaned.isprintable()
    assert len(cleaned) == MAX_GOODBYE_REASON and cleaned.endswith("...")


# --- the services on a real SQLite database -------------------------------------------------------------


def registration(name: str) -> Registration:
    return Registration(
        name, name, "127.0.0.1", 20000, 20010, [{"kind": "cpu", "index": 0, "name": "s"}], "t"
    )


@pytest.mark.db_seed("e" * 64, agents=("a", "b"))
def test_the_reconciler_never_marks_a_stopped_agent_lost_and_ends_what_is_left_on_it(db: Database) -> None:
    with db.write() as session:
        job = create_job(session, JobCreate(bundle_digest="e" * 64, command=["python", "t.py"], workers=2))
        schedule_pending(session)
        job_id = job.id
        ids = {a.name: a.id for a in session.scalars(select(Agent)).all()}
    with db.write() as session:
        # "a" stops cleanly while its task's start command is on its way; "b" goes silent.
        assert accept_goodbye(session, ids["a"], "systemctl stop", replica_id="r", epoch=None)
    with db.write() as session:
        assert [c.name for c in capacities(session)] == ["b"]  # placement never picks a stopped agent
    later = utcnow() + timedelta(seconds=60)  # both agents' timeouts (30 s) have long passed
    with db.write() as session:
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300, now=later)
    with db.read() as session:
        stopped, silent = session.get(Agent, ids["a"]), session.get(Agent, ids["b"])
        assert stopped is not None and silent is not None
        assert stopped.lost_at is None and stopped.stopped_at is not None
        assert agent_state(stopped, later) == "stopped"
        assert silent.lost_at is not None and agent_state(silent, later) == "lost"
        tasks = {t.agent_id: t for t in session.scalars(select(Task).where(Task.job_id == job_id)).all()}
        assert tasks[ids["a"]].state == "LOST" and "agent was stopped" in tasks[ids["a"]].message
        assert tasks[ids["b"]].state == "LOST" and "stopped heartbeating" in tasks[ids["b"]].message
        assert session.get(Job, job_id).state == "RESTARTING"
        assert lost_agent_names(session, 100, later) == ["b"]
        assert count_cluster(session, later).agents_by_liveness == {"stopped": 1, "lost": 1}
    with db.write() as session:  # a second pass: nothing more happens to the stopped agent
        reconcile(session, backoff_base_s=BACKOFF, default_startup_timeout_s=300, now=later)
    with db.read() as session:
        stopped = session.get(Agent, ids["a"])
        assert stopped is not None and stopped.lost_at is None and stopped.stopped_at is not None


@pytest.mark.db_seed(None, agents=("a",))
def test_only_what_is_heard_after_the_goodbye_clears_it(db: Database) -> None:
    with db.read() as session:
        agent_id = session.scalars(select(Agent.id)).one()
    heard_before = utcnow()
    with db.write() as session:
        accept_goodbye(session, agent_id, "systemctl stop", replica_id="r", epoch=None)
    with db.write() as session:  # this replica's flush of what it heard before the goodbye
        record_heartbeats(session, {agent_id: heard_before}, timeout_s=30)
    with db.read() as session:
        agent = session.get(Agent, agent_id)
        assert agent is not None and agent_state(agent) == "stopped"
    with db.write() as session:  # heard on a later stream
        record_heartbeats(session, {agent_id: utcnow() + timedelta(seconds=1)}, timeout_s=30)
    with db.read() as session:
        agent = session.get(Agent, agent_id)
        assert agent is not None and agent.stopped_at is None and agent_state(agent) == "online"

    with db.write() as session:
        accept_goodbye(session, agent_id, "systemctl stop", replica_id="r", epoch=None)
    with db.write() as session:  # registering again clears it too
        agent = register_agent(session, registration("a"), 30)
        assert agent.stopped_at is None and agent_state(agent) == "online"


@pytest.mark.db_seed(None, agents=("a",))
def test_a_goodbye_on_a_stream_a_newer_one_superseded_changes_nothing(db: Database) -> None:
    with db.write() as session:
        agent = session.scalars(select(Agent)).one()
        agent.stream_replica, agent.stream_epoch = "r2", 5
        agent_id = agent.id
    with db.write() as session:
        assert not accept_goodbye(session, agent_id, "old stream", replica_id="r1", epoch=4)
    with db.read() as session:
        agent = session.get(Agent, agent_id)
        assert agent is not None and agent.stopped_at is None and agent.stream_replica == "r2"
