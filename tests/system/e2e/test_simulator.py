"""The benchmark's agent simulator (testkit/mwms_testkit/simulator.py) against a real coordinator, small and fast.

Keeps the simulator honest as the protocol changes: 50 simulated agents register and heartbeat, a
16-worker gang on CPU slots is placed on distinct agents, reaches RUNNING and then SUCCEEDED, its tasks'
log lines and metric points are acknowledged and readable, and no agent is lost. Asserts behaviour, not
speed; the speed targets live in bench/run.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from mwms_testkit.cluster import Cluster, pack
from mwms_testkit.simulator import SimConfig, Simulator, TelemetryPlan  # noqa: E402

pytestmark = pytest.mark.e2e
AGENTS = 50
WORKERS = 16
PORT_BASE = 26000  # 50 agents x 10 ports: 26000-26499, clear of other tests' agents and ephemeral ports


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(root=tmp_path_factory.mktemp("simulator"))
    try:
        cluster.start_server()
        yield cluster
    finally:
        cluster.stop()


async def poll(what: str, probe, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    """Awaits `probe()` until it returns something truthy; fails with the last value seen."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last observed: {last!r}")


async def exercise(cluster: Cluster) -> None:
    config = SimConfig(
        join_token=cluster.join_token,
        server=f"127.0.0.1:{cluster.grpc_port}",
        heartbeat_interval_s=0.5,
        task_run_s=1.5,
        port_base=PORT_BASE,
    )
    sim = Simulator(config, AGENTS, run_id="e2e")
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    async with httpx.AsyncClient(base_url=cluster.api, headers=headers, trust_env=False, timeout=30) as http:
        try:
            await sim.register_all()
            assert all(a.agent_id and a.credential for a in sim.agents)
            await sim.connect_all(timeout_s=20)
            for agent in sim.agents:
                agent.telemetry = TelemetryPlan(metric_points_per_s=200, log_lines_per_s=200)

            bundle = pack({"p.py": "print('simulated')\n"})
            digest = (await http.post("/api/v1/bundles", files={"file": ("b.tar.gz", bundle)})).json()[
                "digest"
            ]
            body = {
                "bundle_digest": digest,
                "command": ["python", "p.py"],
                "workers": WORKERS,
                "gpus_per_worker": 0,
            }
            response = await http.post("/api/v1/jobs", json=body)
            assert response.status_code == 201, response.text
            job_id = response.json()["id"]

            async def ended() -> dict | None:
                job = (await http.get(f"/api/v1/jobs/{job_id}")).json()
                return job if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

            job = await poll("the gang to end", ended)
            states = [e["to_state"] for e in job["events"]]
            assert job["state"] == "SUCCEEDED", (job["reason"], states)
            assert "RUNNING" in states and states.index("RUNNING") < states.index("SUCCEEDED"), states

            tasks = [t for t in sim.tasks() if t.job_id == job_id]
            assert sorted(t.index for t in tasks) == list(range(WORKERS))
            holders = {a.name for a in sim.agents for t in a.history.values() if t.job_id == job_id}
            assert len(holders) == WORKERS, "one CPU slot per agent: every worker on its own agent"
            await poll("final acks of every task", lambda: _true(all(t.final_acked for t in tasks)))
            # A batch's ack may come after the final ack: the coordinator acks batches once they are stored.
            await poll(
                "acks of every line and point",
                lambda: _true(
                    all(
                        t.acked_log_seq >= t.sent_log_seq and t.acked_metric_seq >= t.sent_metric_seq
                        for t in tasks
                    )
                ),
            )
            for task in tasks:
                assert task.sent_log_seq > 0 and task.acked_log_seq == task.sent_log_seq
                assert task.sent_metric_seq > 0 and task.acked_metric_seq == task.sent_metric_seq
                assert task.rejected == 0
            chief = next(t for t in tasks if t.index == 0)
            lines = (await http.get(f"/api/v1/jobs/{job_id}/logs", params={"task": 0, "tail": 10000})).json()
            assert [x["seq"] for x in lines["lines"]] == list(range(1, chief.sent_log_seq + 1))
            points = (await http.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "loss"})).json()[
                "points"
            ]
            assert len(points) == sum(t.sent_metric_seq for t in tasks)

            assert all(a.heartbeats for a in sim.agents), "every agent had heartbeats acknowledged"
            assert sim.unanswered(time.monotonic() - 5) == 0
            assert not [e for a in sim.agents for e in a.stream_errors]
            assert not [r for a in sim.agents for r in a.refused_starts]
            agents = (await http.get("/api/v1/agents")).json()
            names = {a.name for a in sim.agents}
            mine = [a for a in agents if a["name"] in names]
            assert len(mine) == AGENTS and all(a["online"] for a in mine), [
                a["name"] for a in mine if not a["online"]
            ]
        finally:
            await sim.close()


async def _true(value: bool) -> bool:
    return value


def test_simulated_fleet_runs_a_gang(sim_cluster: Cluster) -> None:
    asyncio.run(asyncio.wait_for(exercise(sim_cluster), timeout=60))
