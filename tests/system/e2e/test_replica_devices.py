"""Device readings across replicas: two coordinators on one PostgreSQL database, an agent with stand-in GPUs
(testkit/mwms_testkit/fake_gpus.py) connected to replica B only; replica A, which holds no stream of it, shows its newest
readings from the device_samples table B writes, and B from its memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mwms_testkit.cluster import wait_until
from mwms_testkit.fake_gpus import start_fake_gpu_agent, two_gpus, write_samples
from mwms_testkit.replica_cluster import Replica, replicated

pytestmark = pytest.mark.e2e


def _readings(replica: Replica, agent_id: str) -> list[tuple[int, float]] | None:
    everyone = replica.http.get("/api/v1/devices")
    assert everyone.status_code == 200, everyone.text
    found = {a["agent_id"]: a["devices"] for a in everyone.json()}
    devices = found.get(agent_id)
    return [(d["index"], d["utilization_pct"]) for d in devices] if devices else None


def test_a_replica_without_the_stream_shows_the_agents_readings(tmp_path: Path, postgres: Any) -> None:
    samples = tmp_path / "samples.json"
    with replicated(tmp_path, postgres.create_database("replica_devices"), 2) as cluster:
        a, b = cluster.replicas
        cluster.agents["gpu-agent"] = start_fake_gpu_agent(b, "gpu-agent", samples, port_low=23300)
        row = cluster.wait_online(a, "gpu-agent")
        agent_id = row["id"]

        assert wait_until(lambda: _readings(a, agent_id), 20, "the agent's readings through replica A") == [
            (0, 10.0),
            (1, 20.0),
        ]
        assert _readings(b, agent_id) == [(0, 10.0), (1, 20.0)]  # B holds the stream: from memory

        # A newer sample reaches A too: the newest per device wins.
        write_samples(samples, two_gpus(70.0, 80.0))
        wait_until(
            lambda: _readings(a, agent_id) == [(0, 70.0), (1, 80.0)] or None,
            20,
            "the newer readings through replica A",
            observed=lambda: str(_readings(a, agent_id)),
        )

        one = a.http.get(f"/api/v1/agents/{agent_id}/devices", params={"minutes": 5})
        assert one.status_code == 200, one.text
        body = one.json()
        assert [(d["index"], d["utilization_pct"]) for d in body["latest"]] == [(0, 70.0), (1, 80.0)]
        assert body["refused"] == 0  # counted by the replica holding the stream only
