"""Device telemetry end to end: a real coordinator and a real agent process whose GPUs are stand-ins.

No GPU exists here: the agent finds two GPUs through an `nvidia-smi` script and samples them through its
MWMS_DEVICE_SAMPLER hook (testkit/mwms_testkit/fake_gpus.py). Everything else is real: the agent's session, gRPC, the
coordinator's checks, batched writes to SQLite, the REST endpoints, a real job on the GPUs.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mwms_testkit.cluster import Cluster, wait_until
from mwms_testkit.fake_gpus import start_fake_gpu_agent, two_gpus, write_samples

pytestmark = pytest.mark.e2e


@pytest.fixture
def gpu_cluster(tmp_path: Path):
    cluster = Cluster(root=tmp_path)
    samples = tmp_path / "samples.json"
    try:
        cluster.start_server()
        start_fake_gpu_agent(cluster, "gpu-agent", samples, port_low=23100)
        yield cluster, samples
    finally:
        cluster.stop()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _agent(cluster: Cluster) -> dict[str, Any]:
    [agent] = [a for a in cluster.http.get("/api/v1/agents").json() if a["name"] == "gpu-agent"]
    return agent


def _devices(cluster: Cluster, agent_id: str) -> dict[str, Any]:
    response = cluster.http.get(f"/api/v1/agents/{agent_id}/devices", params={"minutes": 10})
    assert response.status_code == 200, response.text
    return response.json()


def test_samples_arrive_are_stored_and_bad_ones_are_refused(gpu_cluster) -> None:
    cluster, samples = gpu_cluster
    agent = _agent(cluster)
    assert [(d["kind"], d["index"]) for d in agent["devices"]] == [("gpu", 0), ("gpu", 1)]
    agent_id = agent["id"]

    # Samples reach the newest-per-device view and, batched, the stored series.
    def arrived() -> dict[str, Any] | None:
        found = _devices(cluster, agent_id)
        points = [len(s["points"]) for s in found["series"]]
        return found if len(found["latest"]) == 2 and len(points) == 2 and min(points) >= 1 else None

    found = wait_until(arrived, 30, "device samples of both GPUs")
    assert [
        (d["index"], d["utilization_pct"], d["memory_used_mib"], d["temperature_c"]) for d in found["latest"]
    ] == [
        (0, 10.0, 4096, 55.0),
        (1, 20.0, 2048, 50.0),
    ]
    assert found["refused"] == 0
    point = found["series"][0]["points"][-1]
    assert point["utilization_pct"] == 10.0 and point["memory_total_mib"] == 81920

    everyone = cluster.http.get("/api/v1/devices").json()
    assert [(a["agent_id"], len(a["devices"])) for a in everyone] == [(agent_id, 2)]

    # Bad samples are refused one by one and counted; the good one beside them is kept, the stream lives on.
    bad = [
        {
            "index": 0,
            "utilization_pct": float("nan"),
            "memory_used_mib": 1,
            "memory_total_mib": 2,
            "temperature_c": 40,
        },
        {
            "index": 1,
            "utilization_pct": 1e308,
            "memory_used_mib": 1,
            "memory_total_mib": 2,
            "temperature_c": 40,
        },
        {
            "index": 0,
            "utilization_pct": 5.0,
            "memory_used_mib": -1,
            "memory_total_mib": 2,
            "temperature_c": 40,
        },
        {
            "index": 0,
            "utilization_pct": 5.0,
            "memory_used_mib": 1,
            "memory_total_mib": 2**40,
            "temperature_c": 40,
        },
        {
            "index": 0,
            "utilization_pct": 5.0,
            "memory_used_mib": 1,
            "memory_total_mib": 2,
            "temperature_c": -3.0,
        },
        {
            "index": 7,
            "utilization_pct": 5.0,
            "memory_used_mib": 1,
            "memory_total_mib": 2,
            "temperature_c": 40,
        },
        {
            "index": 1,
            "utilization_pct": 33.0,
            "memory_used_mib": 1,
            "memory_total_mib": 2,
            "temperature_c": 40,
        },
    ]
    write_samples(samples, bad)
    refused = wait_until(
        lambda: (f := _devices(cluster, agent_id))["refused"] >= 6 and f, 30, "the bad samples to be refused"
    )
    assert refused["refused"] % 6 == 0, refused["refused"]  # six refused per message, every message
    assert {d["index"]: d["utilization_pct"] for d in refused["latest"]}[1] == 33.0

    write_samples(samples, two_gpus(70.0, 80.0))
    recovered = wait_until(
        lambda: (f := _devices(cluster, agent_id))["latest"][0]["utilization_pct"] == 70.0 and f,
        30,
        "good samples again after the bad ones",
    )
    assert cluster.agent_online("gpu-agent")
    assert all(0 <= p["utilization_pct"] <= 100 for s in recovered["series"] for p in s["points"])
    log = cluster.agents["gpu-agent"].log_tail(400)
    assert "connection to the coordinator lost" not in log, log  # the stream was never broken

    assert cluster.http.get("/api/v1/agents/nosuchagent/devices").status_code == 404


PROGRAM = """
import os, time
print("GPUS", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
time.sleep(6)
"""


def test_a_jobs_tasks_show_their_devices_over_their_run(gpu_cluster) -> None:
    cluster, samples = gpu_cluster
    write_samples(samples, two_gpus(90.0, 45.0))
    agent_id = _agent(cluster)["id"]
    wait_until(
        lambda: [d["utilization_pct"] for d in _devices(cluster, agent_id)["latest"]] == [90.0, 45.0],
        30,
        "the new readings before the job starts",
    )
    job_id = cluster.submit({"main.py": PROGRAM}, ["python", "main.py"], workers=1, gpus_per_worker=2)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + cluster.logs_text(job_id)

    def with_points() -> dict[str, Any] | None:
        response = cluster.http.get(f"/api/v1/jobs/{job_id}/devices")
        assert response.status_code == 200, response.text
        found = response.json()
        series = found["tasks"][0]["series"]
        return found if len(series) == 2 and all(s["points"] for s in series) else None

    found = wait_until(with_points, 30, "the task's device series")
    [task] = found["tasks"]
    assert found["attempt"] == 1 and found["bucket_seconds"] >= 5
    assert task["device_kind"] == "gpu" and task["device_indices"] == [0, 1]
    assert task["agent_name"] == "gpu-agent" and task["started_at"] and task["ended_at"]
    by_index = {s["index"]: s["points"] for s in task["series"]}
    # The bucket that holds the task's end was sampled after the switch to 90 % and 45 %.
    assert by_index[0][-1]["utilization_pct"] == 90.0 and by_index[1][-1]["utilization_pct"] == 45.0
    started, ended = _time(task["started_at"]), _time(task["ended_at"])
    width = timedelta(seconds=found["bucket_seconds"])
    for points in by_index.values():
        assert all(started - width < _time(p["at"]) <= ended for p in points), (task, points)

    assert cluster.http.get(f"/api/v1/jobs/{job_id}/devices", params={"attempt": 2}).status_code == 404
    assert cluster.http.get("/api/v1/jobs/nosuchjob/devices").status_code == 404
