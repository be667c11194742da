"""mwms_runtime inside real 2-worker jobs: reduced metrics through the API, artifacts, hang protection."""

from __future__ import annotations

import pytest

from mwms_testkit import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.tf]

REPORTING = """
import mwms_runtime
import tensorflow as tf

strategy = mwms_runtime.strategy()
task = mwms_runtime.context().task_index
for step in range(1, 6):
    mwms_runtime.report(step, {"mean_value": float((task + 1) * step)})
    mwms_runtime.report(step, {"sum_value": float((task + 1) * step)}, reduce="SUM")
    per_replica = strategy.run(lambda: tf.constant([1.0, 2.0]) * (task + 1))
    mwms_runtime.report(step, {"per_replica": per_replica})
import os
with open(os.path.join(mwms_runtime.output_dir(), "note.txt"), "w") as f:
    f.write(f"written by task {task}")
mwms_runtime.flush()
print("REPORTED", flush=True)
"""

ONE_SIDED = """
import mwms_runtime
strategy = mwms_runtime.strategy()
if mwms_runtime.context().task_index == 0:
    mwms_runtime.report(1, {"loss": 1.0})
print("worker done", flush=True)
import time
time.sleep(60)
"""


def test_reported_metrics_are_reduced_across_workers_and_stored_once(cluster):
    job_id = cluster.submit({"train.py": REPORTING}, ["python", "train.py"], workers=2, name="reporting")
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"] + cluster.logs_text(job_id)

    series: dict[str, dict[int, float]] = {}
    points = cluster.metrics(job_id)
    keys = [(p["name"], p["attempt"], p["step"]) for p in points]
    assert len(keys) == len(set(keys)), "duplicate points"
    for p in points:
        assert p["attempt"] == 1
        series.setdefault(p["name"], {})[p["step"]] = p["value"]
    assert series["mean_value"] == {s: 1.5 * s for s in range(1, 6)}  # mean of 1*s and 2*s
    assert series["sum_value"] == {s: 3.0 * s for s in range(1, 6)}
    assert series["per_replica"] == {s: 2.25 for s in range(1, 6)}  # mean of [1, 2] and [2, 4]

    only_sum = cluster.metrics(job_id, name="sum_value", min_step=2, max_step=3)
    assert [(p["step"], p["value"]) for p in only_sum] == [(2, 6.0), (3, 9.0)]

    summary = cluster.job(job_id)
    assert summary["step"] == 5

    artifacts = cluster.http.get(f"/api/v1/jobs/{job_id}/artifacts").json()
    paths = {a["path"] for a in artifacts}
    assert "note.txt" in paths, paths
    assert any(p.startswith("tensorboard/") for p in paths), paths
    body = cluster.http.get(f"/api/v1/jobs/{job_id}/artifacts/note.txt").text
    assert body == "written by task 0"  # the chief's output directory
    assert cluster.http.get(f"/api/v1/jobs/{job_id}/artifacts/../../etc/passwd").status_code in (400, 404)


def test_report_on_one_worker_fails_clearly_instead_of_hanging(cluster):
    job_id = cluster.submit(
        {"train.py": ONE_SIDED},
        ["python", "train.py"],
        workers=2,
        name="one-sided",
        env={"MWMS_REPORT_TIMEOUT_S": "3"},
    )
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "FAILED"
    assert "code 70" in job["reason"] and "every worker" in job["reason"], job["reason"]


def test_keras_example_reports_true_batch_metrics(cluster):

    from mwms_testkit.cluster import pack_dir

    example = REPO / "examples" / "keras_fit"
    job_id = cluster.submit(
        pack_dir(example),
        ["python", "train.py", "--epochs", "2", "--steps-per-epoch", "10"],
        workers=2,
        name="keras-fit",
    )
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    series: dict[str, dict[int, float]] = {}
    for p in cluster.metrics(job_id):
        series.setdefault(p["name"], {})[p["step"]] = p["value"]
    assert max(series["accuracy"].values()) <= 1.0
    # fit's batch loss is the running mean of the epoch, so the last batch of an epoch equals the epoch loss
    assert abs(series["loss"][20] - series["epoch_loss"][1]) < 1e-4, (
        series["loss"][20],
        series["epoch_loss"],
    )
    assert series["loss"][20] < series["loss"][1]
    assert any(
        a["path"].startswith("model") for a in cluster.http.get(f"/api/v1/jobs/{job_id}/artifacts").json()
    )
