"""Unit tests of mwms_runtime that start no TensorFlow worker processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mwms_runtime
from mwms_runtime import ReducedMetrics, env, reporting, save_paths
from mwms_runtime.writer import MetricsRecord, MetricsWriter


@pytest.fixture
def clean_env(monkeypatch):
    """Remove every MWMS_* variable and TF_CONFIG from the environment."""
    for name in list(os.environ):
        if name.startswith("MWMS_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    return monkeypatch


def test_context_outside_a_job(clean_env, tmp_path):
    clean_env.chdir(tmp_path)
    ctx = mwms_runtime.context()
    assert (ctx.job_id, ctx.task_index, ctx.num_workers, ctx.is_chief, ctx.in_job) == (
        "local",
        0,
        1,
        True,
        False,
    )
    assert ctx.output_dir == str(tmp_path / "mwms-output")
    assert ctx.checkpoint_dir == str(tmp_path / "mwms-output" / "checkpoints")


def test_context_from_agent_env(clean_env, tmp_path):
    clean_env.setenv("MWMS_JOB_ID", "job-1")
    clean_env.setenv("MWMS_ATTEMPT", "2")
    clean_env.setenv("MWMS_TASK_INDEX", "1")
    clean_env.setenv("MWMS_NUM_WORKERS", "3")
    clean_env.setenv("MWMS_OUTPUT_DIR", str(tmp_path / "out"))
    clean_env.setenv("MWMS_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    ctx = mwms_runtime.context()
    assert (ctx.job_id, ctx.attempt, ctx.task_index, ctx.num_workers, ctx.is_chief) == (
        "job-1",
        2,
        1,
        3,
        False,
    )
    assert mwms_runtime.checkpoint_dir() == str(tmp_path / "ckpt")
    assert (tmp_path / "ckpt").is_dir()


@pytest.mark.parametrize(
    ("tf_config", "expected"),
    [
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}, (1, 2, False)),
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}, (0, 2, True)),
        (
            {"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}},
            (1, 2, False),
        ),
        (
            {"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}},
            (0, 2, True),
        ),
    ],
)
def test_context_from_tf_config_only(clean_env, tf_config, expected):
    clean_env.setenv("TF_CONFIG", json.dumps(tf_config))
    ctx = mwms_runtime.context()
    assert (ctx.task_index, ctx.num_workers, ctx.is_chief) == expected


def test_write_path_chief_gets_base(clean_env, tmp_path):
    base = str(tmp_path / "models" / "model.keras")
    with mwms_runtime.saving(base) as path:
        assert path == base
        Path(path).write_text("chief")
    assert Path(base).read_text() == "chief"


def test_write_path_non_chief_is_unique_and_cleaned(clean_env, tmp_path):
    clean_env.setenv("MWMS_TASK_INDEX", "2")
    clean_env.setattr(save_paths.tempfile, "tempdir", str(tmp_path))
    base = str(tmp_path / "out" / "model.keras")
    first = mwms_runtime.write_path(base)
    second = mwms_runtime.write_path(base)
    assert first != second
    for path in (first, second):
        assert os.path.basename(path) == "model.keras"
        assert os.path.basename(os.path.dirname(path)).startswith("mwms-worker-2-")
        Path(path).write_text("x")
        mwms_runtime.cleanup_write_path(path)
        assert not os.path.exists(os.path.dirname(path))
    with mwms_runtime.saving(base) as path:
        os.makedirs(path)  # a SavedModel directory
    assert not os.path.exists(os.path.dirname(path))
    assert not os.path.exists(base)


def test_write_path_left_behind_is_removed_at_exit_under_tmpdir(clean_env, tmp_path):
    tmpdir = tmp_path / "task-tmp"
    tmpdir.mkdir()
    code = (
        "import mwms_runtime; p = mwms_runtime.write_path('out/model.keras'); "
        "open(p, 'w').write('x'); print(p)"
    )
    env_vars = {**os.environ, "MWMS_TASK_INDEX": "1", "TMPDIR": str(tmpdir)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path, env=env_vars
    )
    path = out.stdout.strip()
    assert path.startswith(str(tmpdir / "mwms-worker-1-")), path
    assert list(tmpdir.iterdir()) == []


def test_cleanup_never_removes_a_path_it_did_not_create(clean_env, tmp_path):
    keep = tmp_path / "keep" / "model.keras"
    keep.parent.mkdir()
    keep.write_text("x")
    mwms_runtime.cleanup_write_path(str(keep))
    assert keep.exists()


def test_reduce_op_validation():
    with pytest.raises(ValueError, match="MEAN' or 'SUM"):
        reporting.ops_for(["a"], "MAX")
    with pytest.raises(ValueError, match="not reported"):
        reporting.ops_for(["a"], {"b": "SUM"})
    assert reporting.ops_for(["a", "b"], {"b": "sum"}) == {"a": "MEAN", "b": "SUM"}


def test_reduced_values_are_written_by_the_chief_without_a_collective(clean_env, monkeypatch):
    records: list[MetricsRecord] = []

    class RecordingWriter:
        def put(self, record: MetricsRecord) -> None:
            records.append(record)

    def no_collective(*args, **kwargs):
        raise AssertionError("reduced values must not start a collective")

    def abort(message: str) -> None:
        raise RuntimeError(message)

    monkeypatch.setattr(reporting.writer, "get_writer", RecordingWriter)
    monkeypatch.setattr(reporting, "_all_reduce_sum", no_collective)
    monkeypatch.setattr(reporting, "_abort", abort)
    # Two workers and no strategy: a per-replica report() would refuse, reduced values need none.
    clean_env.setenv("MWMS_NUM_WORKERS", "2")
    clean_env.setenv("MWMS_TASK_INDEX", "0")
    values = {"a": 1, "b": np.float32(2.5), "c": np.array([[4.0]])}
    assert mwms_runtime.report(3, values, reduced=True) == {"a": 1.0, "b": 2.5, "c": 4.0}
    assert mwms_runtime.report(4, ReducedMetrics(values={"d": 0.5}, agreed=np.bool_(True))) == {"d": 0.5}
    assert [(r.step, r.values) for r in records] == [(3, {"a": 1.0, "b": 2.5, "c": 4.0}), (4, {"d": 0.5})]

    clean_env.setenv("MWMS_TASK_INDEX", "1")
    assert mwms_runtime.report(5, {"a": 1.0}, reduced=True) == {"a": 1.0}
    assert len(records) == 2  # a non-chief writes nothing
    with pytest.raises(ValueError, match="got 2 values for 'v'"):
        mwms_runtime.report(6, {"v": np.array([1.0, 2.0])}, reduced=True)
    with pytest.raises(RuntimeError, match="did not all reduce the same metric names"):
        mwms_runtime.report(7, ReducedMetrics(values={"d": 0.5}, agreed=False))


def test_report_timeout_from_env(clean_env):
    assert reporting.report_timeout_seconds() == 120.0
    clean_env.setenv("MWMS_COLLECTIVE_TIMEOUT_S", "30")
    assert reporting.report_timeout_seconds() == 30.0
    clean_env.setenv("MWMS_REPORT_TIMEOUT_S", "4.5")
    assert reporting.report_timeout_seconds() == 4.5


def test_writer_appends_complete_lines_without_truncating(tmp_path):
    metrics_file = tmp_path / "metrics.jsonl"
    metrics_file.write_text('{"name": "old", "step": 0, "value": 1.0, "time": 1.0}\n')
    writer = MetricsWriter(str(metrics_file), tensorboard_dir=None)
    writer.put(MetricsRecord(step=1, values={"loss": 0.5, "bad": math.nan}, time=123.25))
    writer.put(MetricsRecord(step=2, values={"loss": 0.25}, time=124.5))
    assert writer.flush(timeout=10)
    lines = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert lines == [
        {"name": "old", "step": 0, "value": 1.0, "time": 1.0},
        {"name": "loss", "step": 1, "value": 0.5, "time": 123.25},
        {"name": "bad", "step": 1, "value": "NaN", "time": 123.25},
        {"name": "loss", "step": 2, "value": 0.25, "time": 124.5},
    ]


def test_writer_that_cannot_open_its_file_raises_in_the_caller(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match="cannot open the metrics file .*not-a-dir"):
        MetricsWriter(str(blocker / "metrics.jsonl"), tensorboard_dir=None)


def test_import_is_light_and_selects_legacy_keras(tmp_path):
    code = (
        "import os, sys; os.environ.pop('TF_USE_LEGACY_KERAS', None); import mwms_runtime; "
        "print('tensorflow' in sys.modules, os.environ['TF_USE_LEGACY_KERAS'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.split() == ["False", "1"]
    assert env.DEFAULT_OUTPUT_DIR == "mwms-output"
