"""Real two-worker MultiWorkerMirroredStrategy runs on loopback: examples and report() semantics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mwms_testkit import PROGRAMS
from mwms_testkit.runtime_cluster import EXAMPLES, read_metrics, run_tasks

pytestmark = pytest.mark.tf


def _assert_ok(results) -> None:
    for result in results:
        assert result.returncode == 0, result.describe()


def _results(stdout: str) -> dict:
    lines = [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return {entry["label"]: entry["value"] for entry in lines}


def _final(stdout: str) -> dict[str, str]:
    line = [line for line in stdout.splitlines() if line.startswith("FINAL ")][-1]
    return dict(part.split("=", 1) for part in line.split()[1:])


def _by_name(lines: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for line in lines:
        grouped.setdefault(line["name"], []).append(line)
    return grouped


def _tmp_leftovers(root: Path, index: int) -> list[str]:
    return [p.name for p in (root / f"tmp-{index}").iterdir() if p.name.startswith("mwms-worker-")]


def test_custom_loop_reports_worker_mean_and_resumes(tmp_path):
    root = tmp_path / "run1"
    results = run_tasks(
        [str(EXAMPLES / "custom_loop" / "train.py"), "--steps", "20", "--print-every", "1"],
        cwd=tmp_path / "bundle",
        root=root,
        num_workers=2,
    )
    _assert_ok(results)
    assert not (root / "metrics-1.jsonl").exists() or read_metrics(root / "metrics-1.jsonl") == []
    lines = read_metrics(root / "metrics-0.jsonl")
    assert all(set(line) == {"name", "step", "value", "time"} for line in lines)
    losses = _by_name(lines)["loss"]
    assert [line["step"] for line in losses] == list(range(1, 21))

    local = [
        {int(m[1]): float(m[2]) for m in re.finditer(r"step=(\d+) local_loss=([\d.]+) loss=", r.stdout)}
        for r in results
    ]
    for line in losses:
        expected = (local[0][line["step"]] + local[1][line["step"]]) / 2
        assert line["value"] == pytest.approx(expected, abs=2e-6), line
    assert local[0] != local[1], "both workers saw the same data: the input is not sharded"
    assert losses[-1]["value"] < losses[0]["value"] * 0.5
    assert _final(results[0].stdout)["resumed_from"] == "0"
    assert {p.name for p in (root / "checkpoints").iterdir()} >= {
        "ckpt-10.index",
        "ckpt-20.index",
        "checkpoint",
    }
    assert _tmp_leftovers(root, 1) == []

    # TensorBoard can read the chief's event files.
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    accumulator = event_accumulator.EventAccumulator(str(root / "output-0" / "tensorboard"))
    accumulator.Reload()
    scalars = accumulator.Scalars("loss")
    assert [s.step for s in scalars] == list(range(1, 21))
    assert scalars[-1].value == pytest.approx(losses[-1]["value"], rel=1e-6)

    # A restarted job (here with one worker) continues from the saved step.
    resumed = run_tasks(
        [str(EXAMPLES / "custom_loop" / "train.py"), "--steps", "25"],
        cwd=tmp_path / "bundle",
        root=tmp_path / "run2",
        num_workers=1,
        MWMS_CHECKPOINT_DIR=str(root / "checkpoints"),
    )
    _assert_ok(resumed)
    assert _final(resumed[0].stdout)["resumed_from"] == "20"
    steps = [line["step"] for line in _by_name(read_metrics(tmp_path / "run2" / "metrics-0.jsonl"))["loss"]]
    assert steps == [21, 22, 23, 24, 25]


def test_report_sum_and_mean_across_workers(tmp_path):
    results = run_tasks([str(PROGRAMS / "report_check.py"), "reduce"], tmp_path, tmp_path, num_workers=2)
    # The program ends with the workers reporting different steps and names: both stop with code 70.
    for result in results:
        assert result.returncode == 70, result.describe()
        assert "unexpected_return" not in result.stdout
    assert "report() at step 4: the 2 workers did not all report this step" in results[0].stderr
    assert "this worker reported a (MEAN)" in results[0].stderr
    assert "report() at step 5: the 2 workers did not all report this step" in results[1].stderr
    assert "this worker reported b (MEAN)" in results[1].stderr
    first, second = (_results(r.stdout) for r in results)
    expected = {
        "plain_sum": 3.0,
        "plain_mean": 1.5,
        "tensor_mean": 1.5,
        "replica_sum": 3.0,
        "replica_mean": 1.5,
        "numpy_int": 1.0,
        "per_example_mean": pytest.approx(50.0 / 3),
    }
    for values in (first, second):
        assert values["num_accelerators"] == {}
        # MWMS_NUM_GPUS=0: the strategy itself runs on the CPU, whatever TensorFlow could see.
        assert values["local_devices"] == ["device:CPU:0"]
        assert values["same_strategy"] is True
        assert values["same_arguments"] is True
        assert values["different_arguments"].startswith("mwms_runtime.strategy() was already called")
        assert "communication='RING' (built with 'AUTO')" in values["different_arguments"]
        assert "bytes_per_pack=7 (built with 0)" in values["different_arguments"]
        assert values["step1"] == expected
        assert values["step2"]["tensor_mean"] == 3.0
        assert values["default_mean"] == {"x": 1.5}
        assert values["flushed"] is True
    assert first["write_path"] == str(tmp_path / "output-0" / "saved" / "model.keras")
    assert first["write_path_exists_after"] is True
    assert second["write_path"].startswith(str(tmp_path / "tmp-1" / "mwms-worker-1-"))
    assert second["write_path_exists_after"] is False
    assert second["uncleaned_write_path"].startswith(str(tmp_path / "tmp-1" / "mwms-worker-1-"))
    assert _tmp_leftovers(tmp_path, 1) == []  # removed on the way out

    lines = read_metrics(tmp_path / "metrics-0.jsonl")
    assert read_metrics(tmp_path / "metrics-1.jsonl") == []
    assert {(line["name"], line["step"]) for line in lines} >= {("plain_sum", 1), ("plain_sum", 2), ("x", 3)}
    assert [line["value"] for line in lines if line["name"] == "plain_sum"] == [3.0, 3.0]
    assert not {"a", "b"} & {line["name"] for line in lines}


def test_report_with_different_numbers_of_metrics_fails_clearly(tmp_path):
    results = run_tasks(
        [str(PROGRAMS / "report_check.py"), "mismatch_length"], tmp_path, tmp_path, num_workers=2
    )
    described = "\n".join(r.describe() for r in results)
    clear = [
        r
        for r, names in zip(results, ("a (MEAN)", "a (MEAN), b (MEAN)"), strict=True)
        if r.returncode == 70 and f"this worker reported {names})" in r.stderr
    ]
    # The worker whose collective sees the shape mismatch says so; its peer may instead see that
    # worker end first, and then fails with that error and a note saying where.
    assert clear, described
    for result in results:
        assert "unexpected_return" not in result.stdout
        assert result.returncode != 0, described
        assert "report() at step 1" in result.stderr, described


def test_report_on_one_worker_only_fails_instead_of_hanging(tmp_path):
    results = run_tasks(
        [str(PROGRAMS / "report_check.py"), "one_sided"],
        tmp_path,
        tmp_path,
        num_workers=2,
        timeout=40,
        wait_for=[0],
        MWMS_REPORT_TIMEOUT_S="3",
    )
    chief = results[0]
    assert chief.returncode == 70, chief.describe()
    assert chief.seconds < 30, chief.describe()
    assert "unexpected_return" not in chief.stdout
    assert "mwms_runtime.report() at step 2 waited 3 s for the other workers" in chief.stderr
    assert "every worker must call report() at the same steps" in chief.stderr
    # Step 1, reported by both workers, was written before the failure.
    assert [(line["name"], line["step"]) for line in read_metrics(tmp_path / "metrics-0.jsonl")] == [
        ("loss", 1)
    ]


def test_strategy_after_another_tensorflow_api_raises_clearly(tmp_path):
    results = run_tasks([str(PROGRAMS / "report_check.py"), "after_tf"], tmp_path, tmp_path, num_workers=1)
    _assert_ok(results)
    values = _results(results[0].stdout)
    # TensorFlow sees no GPU here: GPU devices can only come from the count given to the resolver.
    assert values["devices_for_gpus"] == {"0": ["device:CPU:0"], "2": ["device:GPU:0", "device:GPU:1"]}
    assert values["error"].startswith("call mwms_runtime.strategy() before any other TensorFlow API")


def test_keras_fit_two_workers_reports_and_saves_on_chief_only(tmp_path):
    results = run_tasks(
        [str(EXAMPLES / "keras_fit" / "train.py")], tmp_path / "bundle", tmp_path, num_workers=2
    )
    _assert_ok(results)
    finals = [_final(r.stdout) for r in results]
    assert finals[0] == finals[1] and finals[0]["steps"] == "30"
    grouped = _by_name(read_metrics(tmp_path / "metrics-0.jsonl"))
    assert read_metrics(tmp_path / "metrics-1.jsonl") == []
    for name in ("loss", "accuracy", "step_time_seconds", "examples_per_second"):
        assert [line["step"] for line in grouped[name]] == list(range(1, 31)), name
    epoch_loss = [line["value"] for line in grouped["epoch_loss"]]
    assert [line["step"] for line in grouped["epoch_loss"]] == [0, 1, 2]
    assert epoch_loss[-1] < epoch_loss[0] * 0.6
    assert float(finals[0]["loss"]) == pytest.approx(epoch_loss[-1], abs=1e-4)
    assert (tmp_path / "output-0" / "model.keras").is_file()
    assert not (tmp_path / "output-1" / "model.keras").exists()
    assert _tmp_leftovers(tmp_path, 1) == []


def test_sharded_files_each_worker_reads_its_own_files(tmp_path):
    results = run_tasks(
        [str(EXAMPLES / "sharded_files" / "train.py")], tmp_path / "bundle", tmp_path, num_workers=2
    )
    _assert_ok(results)
    seen = []
    for result in results:
        assert "policy=FILE files=4 workers=2" in result.stdout
        match = re.search(r"SAW worker=\d files=(\[[\d, ]*\]) ids=(\[[\d, ]*\])", result.stdout)
        assert match, result.describe()
        seen.append((json.loads(match[1]), set(json.loads(match[2]))))
    assert seen[0][0] and seen[1][0] and not set(seen[0][0]) & set(seen[1][0])
    assert sorted(seen[0][0] + seen[1][0]) == [0, 1, 2, 3]
    assert not seen[0][1] & seen[1][1]
    assert float(_final(results[0].stdout)["loss"]) < 0.01


def test_reduce_metrics_in_the_step_is_written_by_the_chief_without_a_collective(tmp_path):
    results = run_tasks([str(PROGRAMS / "reduced_metrics.py")], tmp_path, tmp_path, num_workers=2)
    # The program ends with the workers reducing "loss" with different ops: both stop with code 70.
    for result in results:
        assert result.returncode == 70, result.describe()
        assert "report() at step 7: the workers did not all reduce the same metric names" in result.stderr
        assert "unexpected_return" not in result.stdout
    first, second = (_results(r.stdout) for r in results)
    for step in (1, 2, 3):
        values = first[f"step{step}"]
        # The same on both workers, what the graph reduced, and what strategy.reduce gives for the loss.
        assert second[f"step{step}"] == values
        assert values["written"] == values["graph"]
        assert values["written"]["loss"] == pytest.approx(values["in_graph"], rel=1e-6)
        assert values["written"]["replica_sum"] == 3.0
        assert values["written"]["worker_mean"] == 1.5
        assert values["written"]["per_example_mean"] == pytest.approx(50.0 / 3)
    for values in (first, second):
        assert values["collectives"] == 0  # neither report() nor MetricsCallback ran report()'s collective
        assert values["explicit"] == {"x": 2.5, "y": 7.0}
        assert "got a per-replica value for 'p'" in values["per_replica_error"]
        assert values["flushed"] is True
    # Worker 0 reported step 4 alone and did not wait for worker 1.
    assert first["one_sided"] == first["step3"]["written"] and "one_sided" not in second

    assert read_metrics(tmp_path / "metrics-1.jsonl") == []
    lines = read_metrics(tmp_path / "metrics-0.jsonl")
    written: dict[tuple[str, int], float] = {}
    for line in lines:  # the first of each (name, step): fit's logs later reuse "loss" at steps 1-3
        written.setdefault((line["name"], line["step"]), line["value"])
    for step in (1, 2, 3):
        for name, value in first[f"step{step}"]["written"].items():
            assert written[(name, step)] == value
    assert written[("loss", 4)] == first["step3"]["written"]["loss"]
    assert (written[("x", 5)], written[("y", 5)]) == (2.5, 7.0)
    assert not any(step == 6 or step == 7 for _, step in written)
    grouped = _by_name(lines)
    assert [line["step"] for line in grouped["accuracy"]] == [1, 2, 3]
    assert [line["step"] for line in grouped["epoch_loss"]] == [0]
    assert grouped["epoch_loss"][0]["value"] == pytest.approx(grouped["loss"][-1]["value"], abs=1e-6)
