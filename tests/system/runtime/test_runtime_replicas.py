"""One TensorFlow process with two replicas (two logical CPUs): report() and MetricsCallback over them."""

from __future__ import annotations

import pytest
from test_runtime_workers import _by_name, _results

from mwms_testkit import PROGRAMS
from mwms_testkit.runtime_cluster import read_metrics, run_tasks

pytestmark = pytest.mark.tf


def test_report_and_callback_with_two_replicas_on_one_worker(tmp_path):
    [result] = run_tasks([str(PROGRAMS / "local_replicas.py")], tmp_path, tmp_path, num_workers=1)
    assert result.returncode == 0, result.describe()
    values = _results(result.stdout)
    assert values["replicas"] == 2
    # Replica 0 holds [1, 2, 3] and replica 1 [4]: MEAN over all four elements, SUM of all of them.
    assert values["reduced"] == {
        "vector_mean": 2.5,
        "vector_sum": 10.0,
        "scalar_mean": 1.5,
        "scalar_sum": 3.0,
    }
    # The same inside a tf.function; a plain tensor counts once per worker, not once per replica.
    assert values["reduced_in_graph"] == {
        "vector_mean": 2.5,
        "vector_sum": 10.0,
        "scalar_sum": 3.0,
        "worker": 7.0,
    }
    assert values["flushed"] is True

    grouped = _by_name(read_metrics(tmp_path / "metrics-0.jsonl"))
    # 7 batches per epoch, 3 per execution: fit calls back after batches 3, 6, 7 (then 10, 13, 14);
    # a report is made whenever a multiple of 2 was reached or passed since the previous call.
    for name in ("loss", "accuracy", "step_time_seconds", "examples_per_second"):
        assert [line["step"] for line in grouped[name]] == [3, 6, 10, 13, 14], name
    assert all(0.0 <= line["value"] <= 1.0 for line in grouped["accuracy"])
    assert [line["step"] for line in grouped["epoch_loss"]] == [0, 1]
    # fit's batch loss is the epoch's running mean, so the epoch's last batch equals the epoch loss.
    assert grouped["loss"][-1]["value"] == pytest.approx(grouped["epoch_loss"][-1]["value"], abs=1e-5)
