"""TensorFlow's two multi-worker tutorials, as written, run through mwms with one and with two workers.

The programs are in programs/tutorials/ (their source and the few constants changed are noted at the top of
each): "Multi-worker training with Keras" (mnist_setup.py, main.py: fit with BackupAndRestore under /tmp,
the model saved to /tmp/keras-model by the chief) and "Custom training loop with MWMS" (mnist.py, main.py:
a CheckpointManager). Neither mentions mwms: they read TF_CONFIG themselves (so a single worker needs one
too), and fit's logs reach mwms as metrics through the agent's task hook, per step and per epoch apart.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app
from mwms.client import Client
from mwms.client.models import Metrics
from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import pack

pytestmark = [pytest.mark.e2e, pytest.mark.tf]

TUTORIALS = PROGRAMS / "tutorials"

# Runs the tutorial's main.py as `python main.py` would, then looks at what it saved. Each task has a
# private /tmp (the sandbox), so the saved model can only be seen from inside the task.
CHECK_SAVED_MODEL = """
import json, os, runpy
runpy.run_path("main.py", run_name="__main__")
import tensorflow as tf
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if index == 0:
    model = tf.keras.models.load_model("/tmp/keras-model")
    print(f"TUTORIAL chief loaded /tmp/keras-model: {len(model.layers)} layers", flush=True)
left = [name for name in os.listdir("/tmp") if name.startswith("workertemp_")]
print(f"TUTORIAL worker {index} left {left}", flush=True)
"""


def _bundle(name: str, extra: dict[str, str] | None = None) -> bytes:
    files: dict[str, str | bytes] = {p.name: p.read_text() for p in (TUTORIALS / name).glob("*.py")}
    files.update(extra or {})
    return pack(files)


def _series(points: Metrics) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    for point in points:
        series.setdefault(point.name, {})[point.step] = point.value
    return series


@pytest.mark.parametrize("workers", [1, 2])
def test_the_keras_tutorial_runs_saves_its_model_and_reports_fits_logs(cluster, workers):
    job_id = cluster.submit(
        _bundle("keras", {"check_saved_model.py": CHECK_SAVED_MODEL}),
        ["python", "check_saved_model.py"],
        workers=workers,
        name=f"tutorial-keras-{workers}",
    )
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    logs = cluster.logs_text(job_id)
    assert job["state"] == "SUCCEEDED", job["reason"] + logs
    assert "TUTORIAL chief loaded /tmp/keras-model: " in logs, logs
    for index in range(workers):
        assert f"TUTORIAL worker {index} left []" in logs, logs  # the workers' temporary copies are gone

    # fit's logs, without a line of mwms in the program: 2 epochs of 5 steps.
    with Client(cluster.api, token=cluster.admin_token) as client:
        metrics = client.job(job_id).metrics()
    per_step, per_epoch = _series(metrics.per_step()), _series(metrics.per_epoch())
    assert set(per_step) >= {"loss", "accuracy", "step_time_seconds"}, sorted(per_step)
    assert sorted(per_step["loss"]) == list(range(1, 11))
    assert set(per_epoch) == {"epoch_loss", "epoch_accuracy"}, sorted(per_epoch)
    assert sorted(per_epoch["epoch_loss"]) == [0, 1]
    # The epoch's loss is its last batch's running mean: the same number, on its own axis.
    assert per_epoch["epoch_loss"][1] == pytest.approx(per_step["loss"][10], abs=1e-4)
    assert all(0.0 <= value <= 1.0 for value in per_step["accuracy"].values())  # not summed over workers

    shown = CliRunner().invoke(app, ["metrics", job_id, "--api", cluster.api, "--token", cluster.admin_token])
    assert shown.exit_code == 0, shown.output
    step_table, _, epoch_table = shown.stdout.partition("per epoch")
    assert "STEP" in step_table and "LOSS" in step_table and "EPOCH_LOSS" not in step_table, shown.stdout
    assert "EPOCH " in epoch_table and "EPOCH_LOSS" in epoch_table and "STEP" not in epoch_table


@pytest.mark.parametrize("workers", [1, 2])
def test_the_custom_training_loop_tutorial_runs(cluster, workers):
    job_id = cluster.submit(
        _bundle("ctl"), ["python", "main.py"], workers=workers, name=f"tutorial-ctl-{workers}"
    )
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
    logs = cluster.logs_text(job_id)
    assert job["state"] == "SUCCEEDED", job["reason"] + logs
    for index in range(workers):
        for epoch in (0, 1):
            assert f"[{index}] Epoch: {epoch}, accuracy: " in logs, logs
    tasks = cluster.job(job_id)["tasks"]
    assert [len(json.loads(task["tf_config"])["cluster"]["worker"]) for task in tasks] == [workers] * workers
