"""Warm interpreters of a GPU agent (worker_agent/warm_pool.py): kept for the GPU set their sandbox binds.

A real coordinator and a real root agent with two stand-in GPUs (mwms_testkit/fake_gpus.py): its warm
interpreter binds both GPUs' nodes, so a task given both starts warm and is told them by UUID at handout,
while a task given one of them starts cold, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mwms_testkit.cluster import Cluster, wait_until
from mwms_testkit.fake_gpus import MINORS, UUIDS, start_fake_gpu_agent

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.tf,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("bwrap") is None, reason="sandboxed tasks need root and bubblewrap"
    ),
]

PROGRAM = r"""
import json, os
print("SEEN " + json.dumps({
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "count": os.environ.get("MWMS_NUM_GPUS"),
    "nodes": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")),
}), flush=True)
"""


@pytest.fixture
def gpu_cluster(tmp_path: Path):
    cluster = Cluster(root=tmp_path)
    try:
        cluster.start_server()
        start_fake_gpu_agent(
            cluster,
            "warm-gpus",
            tmp_path / "samples.json",
            port_low=23500,
            extra_env={"MWMS_AGENT_WARM_POOL": "1"},
        )
        yield cluster
    finally:
        cluster.stop()


def seen_of(cluster: Cluster, job_id: str) -> tuple[dict, str]:
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    text = cluster.logs_text(job_id)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + text
    [line] = [x["text"] for x in cluster.logs(job_id) if x["text"].startswith("SEEN ")]
    return json.loads(line.removeprefix("SEEN ")), text


def test_a_task_given_the_pools_gpus_starts_warm_and_one_given_fewer_starts_cold(gpu_cluster):
    cluster = gpu_cluster
    agent = cluster.agents["warm-gpus"]
    wait_until(
        lambda: "ready in" in agent.log_path.read_text(), 120, "a warm interpreter", observed=agent.log_tail
    )

    both = cluster.submit({"main.py": PROGRAM}, ["python", "main.py"], workers=1, gpus_per_worker=2)
    seen, text = seen_of(cluster, both)
    assert "mwms-agent: warm start" in text, text
    [task] = cluster.job(both)["tasks"]
    assert seen["visible"] == ",".join(UUIDS[i] for i in task["device_indices"]) and seen["count"] == "2", (
        seen
    )
    assert seen["nodes"] == sorted([f"nvidia{MINORS[0]}", f"nvidia{MINORS[1]}", "nvidia-uvm", "nvidiactl"]), (
        seen
    )

    one = cluster.submit({"main.py": PROGRAM}, ["python", "main.py"], workers=1, gpus_per_worker=1)
    seen, text = seen_of(cluster, one)
    assert "mwms-agent: cold start: the warm pool keeps no interpreter for its set of GPUs" in text, text
    [task] = cluster.job(one)["tasks"]
    [gpu] = task["device_indices"]
    assert seen["visible"] == UUIDS[gpu] and seen["nodes"] == sorted(
        [f"nvidia{MINORS[gpu]}", "nvidia-uvm", "nvidiactl"]
    )
