"""report() with per-replica values on two real workers: a batch of calls per collective, same results."""

from __future__ import annotations

import pytest
from test_runtime_workers import _by_name, _results

from mwms_testkit import PROGRAMS
from mwms_testkit.runtime_cluster import read_metrics, run_tasks

pytestmark = pytest.mark.tf


def test_unread_reports_are_reduced_in_batches_and_the_last_batch_is_written_at_exit(tmp_path):
    results = run_tasks([str(PROGRAMS / "report_batching.py"), "batched"], tmp_path, tmp_path, num_workers=2)
    for result in results:
        assert result.returncode == 0, result.describe()
    first, second = (_results(r.stdout) for r in results)
    assert first == second  # the batch limit is agreed, so both ran the same collectives
    # 60 calls: two single-call batches, then doubling sizes up to the cap (or the time bound).
    assert first["collectives"] <= 12, first
    grouped = _by_name(read_metrics(tmp_path / "metrics-0.jsonl"))
    assert [(line["step"], line["value"]) for line in grouped["x"]] == [(s, 1.5 * s) for s in range(1, 61)]
    assert [line["value"] for line in grouped["n"]] == [3.0] * 60
    assert read_metrics(tmp_path / "metrics-1.jsonl") == []


def test_a_program_that_reads_report_results_gets_each_steps_own_values(tmp_path):
    results = run_tasks([str(PROGRAMS / "report_batching.py"), "reading"], tmp_path, tmp_path, num_workers=2)
    for result in results:
        assert result.returncode == 0, result.describe()
    values = _results(results[0].stdout)
    assert values["returned"] == [[s, 1.5 * s] for s in range(1, 21)]
    assert values["collectives"] == 20
    assert values["waited"] == {"x": 1.5 * 21}


def test_workers_reporting_different_names_inside_a_batch_both_exit_70(tmp_path):
    results = run_tasks([str(PROGRAMS / "report_batching.py"), "mismatch"], tmp_path, tmp_path, num_workers=2)
    for result in results:
        assert result.returncode == 70, result.describe()
        assert "unexpected_return" not in result.stdout
        assert "did not all report this step with the same metric names" in result.stderr, result.describe()
    # Every step before the batch the workers disagreed in was written.
    steps = [line["step"] for line in read_metrics(tmp_path / "metrics-0.jsonl")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 2, steps


def test_a_worker_that_fails_with_calls_pending_exits_at_once_with_its_own_error(tmp_path):
    results = run_tasks(
        [str(PROGRAMS / "report_batching.py"), "crash"], tmp_path, tmp_path, num_workers=2, wait_for=[0]
    )
    failed = results[0]
    assert failed.returncode == 1, failed.describe()
    assert "RuntimeError: the training step failed" in failed.stderr
    assert "not written: the program failed" in failed.stderr, failed.describe()
    assert failed.seconds < 30, failed.describe()  # no wait for the other worker's last all-reduce
