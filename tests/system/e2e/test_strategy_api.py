"""Every API on the MultiWorkerMirroredStrategy page, run inside one real 2-worker job and checked by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import pack_dir

pytestmark = [pytest.mark.e2e, pytest.mark.tf]
PROGRAM = PROGRAMS / "strategy_api"


def reference_training(steps: int = 3, lr: float = 0.1) -> tuple[list[float], list[float]]:
    """Full-batch gradient descent on y = 3x + 1 by hand: (losses before each step, [w, b] after)."""
    x = np.arange(8) / 8
    y = 3 * x + 1
    w = b = 0.0
    losses = []
    for _ in range(steps):
        error = w * x + b - y
        losses.append(float(np.mean(error**2)))
        w, b = w - lr * 2 * np.mean(error * x), b - lr * 2 * np.mean(error)
    return losses, [w, b]


@pytest.fixture(scope="module")
def results(cluster):
    job_id = cluster.submit(pack_dir(PROGRAM), ["python", "check_api.py"], workers=2, name="strategy-api")
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + cluster.logs_text(job_id)
    found = {}
    for line in cluster.logs(job_id):
        if line["text"].startswith("RESULT "):
            found[line["task"]] = json.loads(line["text"][len("RESULT ") :])
    assert sorted(found) == [0, 1], cluster.logs_text(job_id)
    return found


def test_scope_makes_mirrored_variables(results):
    for r in results.values():
        assert r["num_replicas"] == 2
        assert "Mirrored" in r["variable_type"]


def test_reduce_sum_and_mean_over_replicas_and_batch(results):
    for r in results.values():
        assert r["sum_none"] == 1.0  # replicas hold 0 and 1
        assert r["mean_none"] == 0.5
        assert r["sum_axis0"] == sum(range(4)) + sum(range(10, 14))  # 52
        assert r["mean_axis0"] == 52 / 8
        assert r["sum_none_vector"] == [10.0, 12.0, 14.0, 16.0]


def test_reduce_partial_last_batch_uses_the_true_denominator(results):
    for r in results.values():
        assert r["partial_sum_axis0"] == 15.0
        assert r["partial_mean_axis0"] == 15.0 / 6


def test_gather_along_both_axes(results):
    for r in results.values():
        assert r["gather_axis0"] == [[0.0, 10.0], [1.0, 11.0]]
        assert r["gather_axis1"] == [[0.0, 10.0, 1.0, 11.0]]


def test_local_results_and_values_from_function(results):
    for task, r in results.items():
        assert r["local_results"] == [task + 200]  # one local replica: its replica id + 100 * 2


def test_distribute_dataset_shards_disjointly_across_workers(results):
    seen = results[0]["distributed_dataset_seen"] + results[1]["distributed_dataset_seen"]
    assert sorted(seen) == list(range(16)), seen
    assert set(results[0]["distributed_dataset_seen"]).isdisjoint(results[1]["distributed_dataset_seen"])


def test_datasets_from_function_input_context(results):
    for task, r in results.items():
        assert r["input_context"] == {
            "num_input_pipelines": 2,
            "input_pipeline_id": task,
            "per_replica_batch_size": 4,
        }
        assert r["first_batch_from_function"] == [task, task + 2, task + 4, task + 6]


def test_keras_fit_matches_hand_computed_gradient_descent(results):
    _, expected = reference_training()
    for r in results.values():
        assert np.allclose(r["fit_weights"], expected, atol=1e-5), (r["fit_weights"], expected)
    assert results[0]["fit_weights"] == results[1]["fit_weights"]


def test_custom_loop_matches_hand_computed_gradient_descent(results):
    losses, expected = reference_training()
    for r in results.values():
        assert np.allclose(r["loop_losses"], losses, atol=1e-5), (r["loop_losses"], losses)
        assert np.allclose(r["loop_weights"], expected, atol=1e-5)
