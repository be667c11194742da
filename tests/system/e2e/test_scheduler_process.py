"""Scheduler passes run in a process of their own (server/live/scheduler_worker.py), beside a real
`mwms server` with simulated agents (testkit/mwms_testkit/simulator.py).

The passes place gangs from that process; the metrics they count show in the coordinator's /metrics; a
scheduler process killed mid-life is started again and the next job is placed; stopping the coordinator
ends it; no pass ever runs in the coordinator's own process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from mwms_testkit.cluster import Cluster, pack, wait_until
from mwms_testkit.simulator import SimConfig, Simulator  # noqa: E402

pytestmark = pytest.mark.e2e
AGENTS = 6
PORT_BASE = 26600  # 6 agents x 10 ports, clear of the other simulator tests' ranges


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def scheduler_pids(server_pid: int) -> list[int]:
    result = []
    for pid in children(server_pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mwms.server.live.scheduler_worker" in command:
            result.append(pid)
    return result


def metric_value(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def until_running(http: httpx.AsyncClient, job_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = (await http.get(f"/api/v1/jobs/{job_id}")).json()
        if job["state"] == "RUNNING":
            return job
        await asyncio.sleep(0.1)
    raise AssertionError(
        f"job {job_id} not RUNNING within {timeout} s: {job.get('state')} {job.get('reason')}"
    )


async def exercise(cluster: Cluster) -> None:
    assert cluster.server is not None
    server_pid = cluster.server.popen.pid
    config = SimConfig(
        join_token=cluster.join_token,
        server=f"127.0.0.1:{cluster.grpc_port}",
        heartbeat_interval_s=0.5,
        task_run_s=None,
        port_base=PORT_BASE,
    )
    sim = Simulator(config, AGENTS, run_id="schedproc")
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    async with httpx.AsyncClient(base_url=cluster.api, headers=headers, trust_env=False, timeout=30) as http:
        try:
            await sim.register_all()
            await sim.connect_all(timeout_s=20)
            digest = (
                await http.post("/api/v1/bundles", files={"file": ("b.tar.gz", pack({"p.py": "print(1)\n"}))})
            ).json()["digest"]

            async def submit(name: str, workers: int) -> str:
                body = {
                    "name": name,
                    "bundle_digest": digest,
                    "command": ["python", "p.py"],
                    "workers": workers,
                    "gpus_per_worker": 0,
                }
                response = await http.post("/api/v1/jobs", json=body)
                assert response.status_code == 201, response.text
                return str(response.json()["id"])

            first = await until_running(http, await submit("first", 3))
            assert len({t["agent_id"] for t in first["tasks"]}) == 3
            pids = scheduler_pids(server_pid)
            assert len(pids) == 1, f"one scheduler process beside the coordinator: {pids}"
            assert pids[0] != server_pid
            # The pass ran there, and what it counted (a placed job's queue wait) shows here.
            metrics = (await http.get("/metrics")).text
            assert metric_value(metrics, "mwms_job_queue_wait_seconds_count") >= 1, metrics[:2000]

            os.kill(pids[0], signal.SIGKILL)
            second = await until_running(http, await submit("second", 2))
            assert {t["agent_id"] for t in second["tasks"]}.isdisjoint(
                {t["agent_id"] for t in first["tasks"]}
            )
            again = scheduler_pids(server_pid)
            assert len(again) == 1 and again[0] != pids[0], (pids, again)
            assert "scheduler process" in cluster.server.log_tail(400)
        finally:
            await sim.close()


def test_passes_run_in_their_own_process_which_comes_back_and_ends_with_the_coordinator(
    tmp_path: Path,
) -> None:
    cluster = Cluster(root=tmp_path)
    try:
        cluster.start_server()
        assert cluster.server is not None
        server_pid = cluster.server.popen.pid
        asyncio.run(exercise(cluster))
        worker = scheduler_pids(server_pid)
        assert worker
        cluster.server.popen.send_signal(signal.SIGTERM)
        cluster.server.popen.wait(timeout=30)
        wait_until(lambda: not Path(f"/proc/{worker[0]}").exists(), 10, "the scheduler process to end")
    finally:
        cluster.stop()
