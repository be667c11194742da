"""Preemption on a real cluster: a higher-priority job preempts a running gang, and a coordinator killed
in the middle of it neither assigns a device twice nor requeues the victim more than once."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import datetime
from typing import Any

import pytest

from mwms.task_environment import PREEMPTED_AND_SAVED_EXIT_CODE
from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import MWMS, Cluster, wait_until

# Saves on SIGTERM (as mwms_runtime's preemption handler does) and exits with the "saved" code.
SAVER = f"""
import os, signal, sys, time

def on_term(*_):
    print("SAVING", flush=True)
    time.sleep(1)
    print("SAVED", flush=True)
    sys.exit({PREEMPTED_AND_SAVED_EXIT_CODE})

signal.signal(signal.SIGTERM, on_term)
print("RUNNING attempt", os.environ["MWMS_ATTEMPT"], flush=True)
while True:
    time.sleep(0.2)
"""
QUICK = "import time; time.sleep(2); print('DONE', flush=True)\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(
        root=tmp_path_factory.mktemp("preempt"),
        server_env={
            "MWMS_PREEMPTION_MIN_RUNTIME_S": "0",
            "MWMS_AGENT_TIMEOUT_S": "6",
            "MWMS_RECONNECT_GRACE_S": "5",
        },
    )
    try:
        cluster.start_server()
        cluster.start_agent("pre-1", 24000)
        cluster.start_agent("pre-2", 24100)
        yield cluster
    finally:
        cluster.stop()


def _at(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _device_intervals(
    jobs: list[dict[str, Any]],
) -> list[tuple[tuple[str, int], datetime, datetime | None, str]]:
    spans = []
    for job in jobs:
        for attempt in job["attempt_history"]:
            for task in attempt["tasks"]:
                start = _at(task["started_at"])
                if start is None:
                    continue
                for index in task["device_indices"]:
                    spans.append(((task["agent_id"], index), start, _at(task["ended_at"]), job["id"]))
    return spans


def test_a_coordinator_killed_mid_preemption_requeues_the_victim_once_and_never_doubles_a_device(cluster):
    low = cluster.submit(
        {"saver.py": SAVER}, ["python", "saver.py"], workers=2, priority=100, preemption_grace_seconds=10
    )
    cluster.wait_for(low, {"RUNNING"}, timeout=60)
    try:
        wait_until(lambda: "RUNNING attempt 1" in cluster.logs_text(low), 30, "the victim's first lines")
        urgent = cluster.submit({"quick.py": QUICK}, ["python", "quick.py"], workers=2, priority=900)
        cluster.wait_for(low, {"PREEMPTING", "PENDING"}, timeout=30)

        # The coordinator dies while the victims save; a new one takes over from the database.
        assert cluster.server is not None
        cluster.server.popen.send_signal(signal.SIGKILL)
        cluster.server.popen.wait(10)
        cluster.start_server()

        done = cluster.wait_for(urgent, {"SUCCEEDED", "FAILED"}, timeout=90)
        assert done["state"] == "SUCCEEDED", done["reason"]
        victim = cluster.wait_for(low, {"RUNNING"}, timeout=60)
        first = victim["attempt_history"][0]
        assert first["state"] == "PREEMPTED" and f"job {urgent}" in first["reason"], first
        assert victim["restarts"] == 0 and len(victim["attempt_history"]) == 2
        states = [e["to_state"] for e in victim["events"]]
        assert states.count("PREEMPTING") == 1 and "FAILED" not in states, states
        assert {t["exit_code"] for t in first["tasks"]} == {PREEMPTED_AND_SAVED_EXIT_CODE}
        assert "SAVED" in cluster.logs_text(low)
        assert any("every worker saved a checkpoint" in e["reason"] for e in victim["events"])

        # No device was ever held by two tasks at once.
        spans = _device_intervals([cluster.job(low), cluster.job(urgent)])
        for i, (device, start, end, job) in enumerate(spans):
            for other_device, other_start, other_end, other_job in spans[i + 1 :]:
                if device != other_device or job == other_job:
                    continue
                assert (end is not None and end <= other_start) or (
                    other_end is not None and other_end <= start
                ), (
                    device,
                    job,
                    other_job,
                )
    finally:
        # Its gang holds both agents until cancelled: a failure above must not leave them to the next test.
        cluster.http.post(f"/api/v1/jobs/{low}/cancel")
        cluster.wait_for(low, {"CANCELLED", "FAILED"}, timeout=30)


def _cli(cluster: Cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MWMS_API=cluster.api, MWMS_TOKEN=cluster.admin_token)
    return subprocess.run([MWMS, *args], capture_output=True, text=True, env=env, timeout=timeout)


def _agent(cluster: Cluster, name: str) -> dict[str, Any]:
    return next(a for a in cluster.http.get("/api/v1/agents").json() if a["name"] == name)


def test_draining_an_agent_moves_its_job_elsewhere_and_wait_returns_once_it_is_empty(cluster):
    job_id = cluster.submit(
        {"saver.py": SAVER}, ["python", "saver.py"], workers=1, preemption_grace_seconds=10
    )
    job = cluster.wait_for(job_id, {"RUNNING"}, timeout=60)
    here = job["tasks"][0]["agent_name"]
    other = next(n for n in ("pre-1", "pre-2") if n != here)
    drained = _cli(cluster, "agent", "drain", here, "--reason", "swap a disk", "--wait", "--timeout", "60s")
    assert drained.returncode == 0, drained.stderr
    agent = _agent(cluster, here)
    assert agent["cordoned"] and agent["draining"] and agent["drained"]
    assert (agent["cordoned_by"], agent["cordon_reason"]) == ("admin", "swap a disk")

    moved = cluster.wait_for(job_id, {"RUNNING"}, timeout=60)
    assert moved["tasks"][0]["agent_name"] == other and moved["restarts"] == 0
    assert moved["attempt_history"][0]["state"] == "PREEMPTED"
    assert f"agent {here} is drained" in moved["attempt_history"][0]["reason"]
    listing = _cli(cluster, "agents")
    assert listing.returncode == 0 and "swap a disk" in listing.stdout, listing.stdout

    # A cordon survives a coordinator restart; uncordon opens the agent again.
    cluster.restart_server()
    assert _agent(cluster, here)["cordoned"]
    assert _cli(cluster, "agent", "uncordon", here).returncode == 0
    assert not _agent(cluster, here)["cordoned"] and not _agent(cluster, here)["draining"]
    cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
    cluster.wait_for(job_id, {"CANCELLED"}, timeout=30)


TRAINER = (PROGRAMS / "preempt_custom_loop.py").read_text()


def test_a_tensorflow_job_preempted_mid_training_resumes_at_the_next_step_with_each_step_reported_once(
    cluster,
):
    steps = 30
    low = cluster.submit(
        {"train.py": TRAINER},
        ["python", "train.py", "--steps", str(steps), "--delay", "0.3"],
        workers=2,
        priority=100,
        preemption_grace_seconds=30,
    )
    cluster.wait_for(low, {"RUNNING"}, timeout=120)
    wait_until(lambda: "STEP 4" in cluster.logs_text(low), 120, "a few training steps")
    urgent = cluster.submit({"quick.py": QUICK}, ["python", "quick.py"], workers=2, priority=900)
    assert cluster.wait_for(urgent, {"SUCCEEDED", "FAILED"}, timeout=120)["state"] == "SUCCEEDED"
    done = cluster.wait_for(low, {"SUCCEEDED", "FAILED"}, timeout=240)
    assert done["state"] == "SUCCEEDED", done["reason"]
    first, second = done["attempt_history"]
    assert first["state"] == "PREEMPTED" and done["restarts"] == 0
    assert {t["exit_code"] for t in first["tasks"]} == {PREEMPTED_AND_SAVED_EXIT_CODE}

    points = cluster.metrics(low, name="loss")
    assert sorted(p["step"] for p in points) == list(range(1, steps + 1)), points  # each step once
    saved = max(p["step"] for p in points if p["attempt"] == 1)
    assert min(p["step"] for p in points if p["attempt"] == 2) == saved + 1
    resumed = [x["text"] for x in cluster.logs(low) if x["attempt"] == 2 and x["text"].startswith("RESUMED")]
    assert resumed and resumed[0].split()[1] == str(saved), resumed
