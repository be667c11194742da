"""An agent given two coordinator replicas (one PostgreSQL database, two `mwms server` processes) moves to
the survivor when the one it is connected to is killed (SIGKILL), and keeps running throughout."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from mwms_testkit.cluster import wait_until
from mwms_testkit.replica_cluster import ReplicaCluster
from mwms_testkit.replica_cluster import replicated as two_replicas

pytestmark = [pytest.mark.e2e]
FAILOVER_LIMIT_S = 10


@pytest.fixture
def replicated(tmp_path, postgres):  # type: ignore[no-untyped-def]
    with two_replicas(
        tmp_path, postgres.create_database("failover"), 2, {"MWMS_HEARTBEAT_INTERVAL_S": "1"}
    ) as cluster:
        yield cluster


def heard_at(row: dict) -> datetime:
    return datetime.fromisoformat(row["last_heartbeat_at"].replace("Z", "+00:00"))


def test_the_agent_moves_to_the_surviving_replica_when_its_own_is_killed(replicated: ReplicaCluster) -> None:
    first, second = replicated.replicas
    agent = replicated.start_agent("fo-1", [first, second], port_low=24000)
    registered = replicated.wait_online(first, "fo-1")
    # It holds a stream there: the first replica records a heartbeat after the registration.
    wait_until(
        lambda: heard_at(replicated.agent_row(first, "fo-1") or registered) > heard_at(registered),
        10,
        "a heartbeat recorded by the first replica",
        observed=agent.log_tail,
    )
    wait_until(
        lambda: f"connected to coordinator {first.grpc_address} (1 of 2)" in agent.log_path.read_text(),
        10,
        "the agent's log to name the first replica",
        observed=agent.log_tail,
    )

    first.kill()
    killed_at = time.monotonic()
    killed_wall = datetime.now().astimezone()

    def on_second() -> dict | None:
        assert agent.popen.poll() is None, f"the agent exited:\n{agent.log_tail()}"
        text = agent.log_path.read_text()
        if f"connected to coordinator {second.grpc_address} (2 of 2)" not in text:
            return None
        row = replicated.agent_row(second, "fo-1")
        # Heard from after the kill: only the survivor can have written that.
        return row if row and row["online"] and heard_at(row) > killed_wall else None

    row = wait_until(
        on_second, FAILOVER_LIMIT_S, "the agent registered with the survivor", observed=agent.log_tail
    )
    registered_after = time.monotonic() - killed_at
    log = agent.log_path.read_text()
    assert f"moving from coordinator {first.grpc_address} (1 of 2) to {second.grpc_address} (2 of 2)" in log

    # It holds the stream: the survivor records a later heartbeat, within the same limit.
    wait_until(
        lambda: heard_at(replicated.agent_row(second, "fo-1") or row) > heard_at(row),
        max(0.1, FAILOVER_LIMIT_S - registered_after),
        "a heartbeat recorded by the survivor",
        observed=agent.log_tail,
    )
    streaming_after = time.monotonic() - killed_at
    print(
        f"failover: registered {registered_after:.2f} s, heartbeat stored {streaming_after:.2f} s after the kill"
    )
    assert agent.popen.poll() is None, agent.log_tail()
    assert replicated.agent_row(second, "fo-1")["online"]
