"""Per-step and per-epoch series kept apart: the axis rule, `mwms metrics`' two tables, the client's views."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mwms import metrics_line
from mwms.cli.main import app
from mwms.client.models import MetricPoint, Metrics
from mwms_testkit.fake_api import FakeState

runner = CliRunner()


def _point(name: str, step: int, value: float) -> dict:
    return {"name": name, "step": step, "value": value, "wall_time": "2026-01-01T00:00:00Z", "attempt": 1}


# What fit's logs give for 2 epochs of 2 steps: a step series and an epoch series of the same metric.
FIT_POINTS = [
    _point("accuracy", 1, 0.25),
    _point("accuracy", 2, 0.5),
    _point("accuracy", 3, 0.75),
    _point("accuracy", 4, 1.0),
    _point("epoch_accuracy", 0, 0.5),
    _point("epoch_accuracy", 1, 1.0),
]


@pytest.fixture
def program(tmp_path: Path) -> Path:
    directory = tmp_path / "my-program"
    directory.mkdir()
    (directory / "train.py").write_text("print('training')\n")
    return directory


def test_the_axis_of_a_series_is_decided_by_its_name() -> None:
    assert metrics_line.axis("epoch_loss") == metrics_line.AXIS_EPOCH == "epoch"
    for name in ("loss", "epochs_seen", "val_epoch_loss", "my_epoch_"):
        assert metrics_line.axis(name) == metrics_line.AXIS_STEP == "step"


def test_the_client_returns_steps_and_epochs_apart() -> None:
    metrics = Metrics(MetricPoint.from_api(raw) for raw in FIT_POINTS)
    assert {(p.name, p.step) for p in metrics.per_epoch()} == {("epoch_accuracy", 0), ("epoch_accuracy", 1)}
    assert [p.step for p in metrics.per_step()] == [1, 2, 3, 4]
    assert {p.axis for p in metrics.per_step()} == {"step"} and metrics.per_epoch()[0].axis == "epoch"
    assert isinstance(metrics.per_step(), Metrics) and metrics.per_step().names() == ["accuracy"]


def test_mwms_metrics_prints_a_table_per_axis(fake_api: tuple[str, FakeState], program: Path) -> None:
    api, state = fake_api
    submitted = runner.invoke(
        app, ["submit", str(program), "--workers", "2", "--api", api, "--wait", "--", "python", "train.py"]
    )
    job_id = submitted.stdout.splitlines()[0]
    state.jobs[job_id].metrics = FIT_POINTS
    shown = runner.invoke(app, ["metrics", job_id, "--api", api])
    assert shown.exit_code == 0, shown.output
    lines = [line.split() for line in shown.stdout.splitlines() if line.strip()]
    title = next(i for i, line in enumerate(lines) if line[:2] == ["per", "epoch"])
    assert lines[:title] == [["STEP", "ACCURACY"], ["1", "0.25"], ["2", "0.5"], ["3", "0.75"], ["4", "1"]]
    assert lines[title + 1 :] == [["EPOCH", "EPOCH_ACCURACY"], ["0", "0.5"], ["1", "1"]]

    state.jobs[job_id].metrics = FIT_POINTS[4:]  # only epochs: one table, no title
    only_epochs = runner.invoke(app, ["metrics", job_id, "--api", api]).stdout.splitlines()
    assert only_epochs[0].split() == ["EPOCH", "EPOCH_ACCURACY"] and len(only_epochs) == 3
