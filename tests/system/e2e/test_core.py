"""End to end: a real coordinator, two real agents, a real 2-worker MultiWorkerMirroredStrategy job."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.e2e

ALLREDUCE_PROGRAM = """
import json, os
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
print("SAW_TF_CONFIG " + os.environ["TF_CONFIG"], flush=True)
print("RESOLVED", resolver.task_type, resolver.task_id, json.dumps(resolver.cluster_spec().as_dict()), flush=True)
value = strategy.run(lambda: tf.constant(float(resolver.task_id + 1)))
print("REDUCED", float(strategy.reduce("SUM", value, axis=None)), flush=True)
"""


def test_two_worker_job_all_reduces_across_agents(cluster):
    job_id = cluster.submit(
        {"train.py": ALLREDUCE_PROGRAM}, ["python", "train.py"], workers=2, name="allreduce"
    )
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + cluster.logs_text(job_id)

    tasks = job["tasks"]
    assert [t["index"] for t in tasks] == [0, 1]
    assert all(t["state"] == "SUCCEEDED" and t["exit_code"] == 0 for t in tasks)
    endpoints = [t["address"] for t in tasks]
    assert len(set(endpoints)) == 2, endpoints
    assert {t["agent_name"] for t in tasks} == {"e2e-1", "e2e-2"}

    for task in tasks:
        text = "\n".join(line["text"] for line in cluster.logs(job_id, task["index"]))
        assert "REDUCED 3.0" in text, text
        seen = json.loads(re.search(r"SAW_TF_CONFIG (.*)", text).group(1))
        assert seen == {"cluster": {"worker": endpoints}, "task": {"type": "worker", "index": task["index"]}}
        assert json.loads(task["tf_config"]) == seen
        assert f"RESOLVED worker {task['index']}" in text

    states = [e["to_state"] for e in job["events"]]
    assert states == ["PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED"], job["events"]
    assert len(job["attempt_history"]) == 1 and job["attempt_history"][0]["state"] == "SUCCEEDED"


def test_failing_task_stops_the_other_and_fails_the_job_with_its_logs(cluster):
    program = (
        "import os, sys, time\n"
        "if os.environ['MWMS_TASK_INDEX'] == '1':\n"
        "    print('about to fail: bad hyperparameter', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(300)\n"
    )
    job_id = cluster.submit({"main.py": program}, ["python", "main.py"], workers=2)
    job = cluster.wait_for(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=90)
    assert job["state"] == "FAILED"
    assert "task 1" in job["reason"] and "code 3" in job["reason"], job["reason"]
    assert "bad hyperparameter" in job["reason"]

    def stopped():
        tasks = cluster.job(job_id)["tasks"]
        return tasks if tasks[0]["state"] == "STOPPED" else None

    from mwms_testkit.cluster import wait_until

    wait_until(stopped, 30, "task 0 to be stopped")


def test_single_worker_job_gets_a_tf_config_of_one_worker(cluster):
    # TensorFlow's tutorials read json.loads(os.environ['TF_CONFIG']) whatever the number of workers.
    program = (
        "import json, os\n"
        "config = json.loads(os.environ['TF_CONFIG'])\n"
        "print(len(config['cluster']['worker']), config['task'], os.environ['MWMS_NUM_WORKERS'], flush=True)\n"
    )
    job_id = cluster.submit({"p.py": program}, ["python3", "p.py"], workers=1)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=60)
    assert job["state"] == "SUCCEEDED", job["reason"] + cluster.logs_text(job_id)
    task = job["tasks"][0]
    assert json.loads(task["tf_config"]) == {
        "cluster": {"worker": [task["address"]]},
        "task": {"type": "worker", "index": 0},
    }
    assert "1 {'type': 'worker', 'index': 0} 1" in cluster.logs_text(job_id)


def test_job_larger_than_the_cluster_is_refused_at_submit(cluster):
    from mwms_testkit.cluster import pack

    digest = cluster.upload(pack({"p.py": "print(1)\n"}))
    body = {"bundle_digest": digest, "command": ["python", "p.py"], "workers": 1, "gpus_per_worker": 4}
    refused = cluster.http.post("/api/v1/jobs", json=body)
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"].startswith("this job can never be placed: none of the ")
    assert "offers GPUs (they offer CPU slots): submit with --gpus-per-worker 0" in refused.json()["detail"]


def test_job_waiting_for_an_agent_stays_pending_with_a_reason(cluster):
    job_id = cluster.submit({"p.py": "print(1)\n"}, ["python", "p.py"], workers=1, agents=["not-joined-yet"])
    from mwms_testkit.cluster import wait_until

    job = wait_until(
        lambda: (j := cluster.job(job_id))["reason"] not in ("", "waiting to be placed") and j,
        10,
        "a PENDING reason",
    )
    assert job["state"] == "PENDING"
    assert "not-joined-yet" in job["reason"]
    cancelled = cluster.http.post(f"/api/v1/jobs/{job_id}/cancel").json()
    assert cancelled["state"] == "CANCELLED"
    again = cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409 and "already CANCELLED" in again.json()["detail"]


def test_cancel_running_job_stops_its_processes(cluster):
    job_id = cluster.submit(
        {"p.py": "import time\nprint('up', flush=True)\ntime.sleep(600)\n"}, ["python", "p.py"]
    )
    cluster.wait_for(job_id, {"RUNNING"}, timeout=60)
    response = cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    from mwms_testkit.cluster import wait_until

    wait_until(
        lambda: all(t["state"] == "STOPPED" for t in cluster.job(job_id)["tasks"]), 30, "tasks STOPPED"
    )
