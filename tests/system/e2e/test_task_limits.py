"""Each task is held to its memory, processes and disk by its own cgroup and the agent's watch.

A root agent (as in CI) with small limits (`--task-pids-max 64`, `--task-disk-max 8M`); the tasks try to
go past them, and each ends with the reason that names the limit, while a task within them runs on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app
from mwms_testkit.cluster import Cluster

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="task cgroups need a root agent (CI runs as root)"),
]

LOOK = r"""
import json, os, threading
threading.stack_size(64 * 1024)
started = 0
holds = threading.Event()
try:
    for _ in range(200):
        threading.Thread(target=holds.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
holds.set()
tmp = os.statvfs("/tmp")
print("LOOK " + json.dumps({
    "cgroup": open("/proc/self/cgroup").read(),
    "oom_score_adj": int(open("/proc/self/oom_score_adj").read()),
    "threads_started": started,
    "tmp_bytes": tmp.f_blocks * tmp.f_frsize,
}), flush=True)
"""

FILL_DISK = """
import os, time
with open(os.path.join(os.environ["MWMS_OUTPUT_DIR"], "big.bin"), "wb") as out:
    for _ in range(64):
        out.write(b"x" * 1024 * 1024)
        out.flush()
        time.sleep(0.05)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    instance = Cluster(root=tmp_path_factory.mktemp("limits"))
    try:
        instance.start_server()
        instance.start_agent(
            "limited", 23000, slots=2, extra_args=["--task-pids-max", "64", "--task-disk-max", "8M"]
        )
        yield instance
    finally:
        instance.stop()


def test_a_task_runs_in_its_own_cgroup_with_its_limits(limited: Cluster) -> None:
    job_id = limited.submit({"look.py": LOOK}, ["python", "look.py"], workers=1)
    job = limited.wait_for(job_id, {"SUCCEEDED", "FAILED"})
    assert job["state"] == "SUCCEEDED", limited.logs_text(job_id)
    line = next(x for x in limited.logs_text(job_id).splitlines() if "LOOK " in x)
    seen = json.loads(line.split("LOOK ", 1)[1])
    memory_line = next(x for x in seen["cgroup"].splitlines() if ":memory:" in x or x.startswith("0::"))
    assert "mwms-tasks-" in memory_line and "/task-" in memory_line, seen["cgroup"]
    assert seen["oom_score_adj"] == 1000  # the kernel kills a task before the agent (-900)
    assert 40 < seen["threads_started"] < 64, seen  # pids.max 64 counts the interpreter's own threads
    # The private /tmp is sized at the task's memory limit: its share of what the agent offers.
    agent = next(a for a in limited.http.get("/api/v1/agents").json() if a["name"] == "limited")
    offered = agent.get("memory_bytes") or 0
    assert offered > 0, agent
    assert seen["tmp_bytes"] <= offered // 2 + 4096, (seen, offered)
    task = job["tasks"][0]
    assert (
        task["memory_limit_bytes"] == seen["tmp_bytes"]
        or abs(task["memory_limit_bytes"] - seen["tmp_bytes"]) < 4096 * 2
    )
    assert task["peak_memory_bytes"] > 1024 * 1024


def test_a_task_that_writes_past_the_disk_limit_ends_with_that_reason(limited: Cluster) -> None:
    job_id = limited.submit(
        {"fill.py": FILL_DISK}, ["python", "fill.py"], workers=1, restart={"max_restarts": 0}
    )
    job = limited.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=90)
    assert job["state"] == "FAILED"
    assert "out of disk" in job["reason"] and "--task-disk-max" in job["reason"], job["reason"]


HOG = """
import os, time
print("allocating", flush=True)
hog = bytearray(int(os.environ["HOG_BYTES"]))
for at in range(0, len(hog), 4096):
    hog[at] = 1
print("survived", flush=True)
"""

TMPFS = """
import os
try:
    with open("/tmp/fill", "wb") as out:
        for _ in range(512):
            out.write(b"x" * 1024 * 1024)
except OSError as error:
    print("TMPFS", error.strerror, flush=True)
    raise SystemExit(3)
"""


def test_a_task_over_its_memory_ends_with_the_limit_in_its_reason_and_its_peak_shown(
    limited: Cluster,
) -> None:
    job_id = limited.submit(
        {"hog.py": HOG},
        ["python", "hog.py"],
        workers=1,
        memory_per_worker=256 * 1024**2,
        env={"HOG_BYTES": str(1024**3)},
        restart={"max_restarts": 0},
    )
    job = limited.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=90)
    assert job["state"] == "FAILED"
    assert "out of memory: 256 MiB limit (--memory-per-worker)" in job["reason"], job["reason"]
    task = job["tasks"][0]
    assert task["memory_limit_bytes"] == 256 * 1024**2
    assert 128 * 1024**2 < task["peak_memory_bytes"] <= 256 * 1024**2 + 4096, task
    shown = CliRunner().invoke(app, ["status", job_id, "--api", limited.api, "--token", limited.admin_token])
    assert "peak" in shown.output.lower() and "MiB" in shown.output, shown.output


def test_a_tasks_private_tmp_is_sized_at_its_memory_limit(limited: Cluster) -> None:
    job_id = limited.submit(
        {"fill.py": TMPFS},
        ["python", "fill.py"],
        workers=1,
        memory_per_worker=256 * 1024**2,
        restart={"max_restarts": 0},
    )
    job = limited.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=90)
    assert job["state"] == "FAILED"  # 512 MiB do not fit: the disk is full, or the task is out of memory
    text = limited.logs_text(job_id)
    assert "TMPFS No space left on device" in text or "out of memory" in job["reason"], text
