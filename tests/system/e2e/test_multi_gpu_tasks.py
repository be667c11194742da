"""Each task of a multi-GPU machine is told and sees exactly its own GPU, and co-located workers of a job
share /dev/shm: a real coordinator and a real root agent with two stand-in GPUs (testkit/mwms_testkit/fake_gpus.py), whose
driver numbers their nodes in the other order (GPU 0 is /dev/nvidia1), running a 2-worker 1-GPU job in its
bubblewrap sandboxes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mwms_testkit.cluster import Cluster
from mwms_testkit.fake_gpus import MINORS, UUIDS, start_fake_gpu_agent

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("bwrap") is None, reason="sandboxed tasks need root and bubblewrap"
    ),
]

# Says what it was told and what it sees, then leaves a file in /dev/shm (its owner's alone, as NCCL's
# are) and reads its peer's.
PROGRAM = r"""
import json, os, time
index = int(os.environ["MWMS_TASK_INDEX"])
mine, peer = f"/dev/shm/from-{index}", f"/dev/shm/from-{1 - index}"
with open(os.open(mine, os.O_CREAT | os.O_WRONLY, 0o600), "w") as f:
    f.write(str(index))
deadline = time.monotonic() + 60
while not os.path.exists(peer) and time.monotonic() < deadline:
    time.sleep(0.1)
print("SEEN " + json.dumps({
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "uuids": os.environ.get("MWMS_GPU_UUIDS"),
    "count": os.environ.get("MWMS_NUM_GPUS"),
    "nodes": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")),
    "agent_gpu_variables": sorted(n for n in os.environ if n.startswith("NVIDIA_")),
    "peer": open(peer).read() if os.path.exists(peer) else None,
}), flush=True)
time.sleep(1)  # the peer reads this task's file before it goes
"""


@pytest.fixture
def gpu_cluster(tmp_path: Path):
    cluster = Cluster(root=tmp_path)
    try:
        cluster.start_server()
        start_fake_gpu_agent(
            cluster,
            "two-gpus",
            tmp_path / "samples.json",
            port_low=23300,
            extra_env={"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0,1"},
        )
        yield cluster
    finally:
        cluster.stop()


def test_each_worker_is_told_its_own_gpu_by_uuid_sees_its_node_and_shares_dev_shm(gpu_cluster) -> None:
    cluster = gpu_cluster
    [agent] = cluster.http.get("/api/v1/agents").json()
    assert [(d["index"], d["uuid"], d["node"]) for d in agent["devices"]] == [
        (0, UUIDS[0], f"/dev/nvidia{MINORS[0]}"),
        (1, UUIDS[1], f"/dev/nvidia{MINORS[1]}"),
    ]
    job_id = cluster.submit({"main.py": PROGRAM}, ["python", "main.py"], workers=2, gpus_per_worker=1)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    logs = cluster.logs_text(job_id)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + logs
    seen = {}
    for task in (0, 1):
        [line] = [x["text"] for x in cluster.logs(job_id, task) if x["text"].startswith("SEEN ")]
        seen[task] = json.loads(line.removeprefix("SEEN "))
    held = {t["index"]: t["device_indices"] for t in cluster.job(job_id)["tasks"]}
    assert sorted(i for indices in held.values() for i in indices) == [0, 1]
    for task, told in seen.items():
        [gpu] = held[task]
        assert told["visible"] == told["uuids"] == UUIDS[gpu], told  # a form CUDA resolves in the sandbox
        assert told["count"] == "1"
        assert told["nodes"] == sorted([f"nvidia{MINORS[gpu]}", "nvidia-uvm", "nvidiactl"]), told
        assert told["agent_gpu_variables"] == []
        assert told["peer"] == str(1 - task), told  # the peer's 0600 file in the job's /dev/shm
    uuids = {t["index"]: t["device_uuids"] for t in job["tasks"]}
    assert uuids == {task: [UUIDS[gpu] for gpu in held[task]] for task in held}
    scheduled = [e["reason"] for e in job["events"] if e["to_state"] == "SCHEDULED"]
    assert scheduled and "workers 0 and 1 share agent" in scheduled[0], scheduled
    assert "--workers 1 --gpus-per-worker 2" in scheduled[0]
