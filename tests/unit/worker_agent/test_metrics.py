"""Tailing the metrics file: complete lines only, seq = line number, malformed lines skipped with a warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mwms.worker_agent import metrics
from mwms.worker_agent.metrics import MetricsTail


def metric(name: str, step: int, value: float) -> str:
    return json.dumps({"name": name, "step": step, "value": value, "time": 1764500000.123}) + "\n"


def test_partial_last_line_waits_until_it_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.poll() == ([], [])  # no file yet
    first, second = metric("loss", 1, 0.5), metric("loss", 2, 0.25)
    path.write_text(first + second[:10])
    points, warnings = tail.poll()
    assert [(p.seq, p.name, p.step, p.value, p.unix_ms) for p in points] == [
        (1, "loss", 1, 0.5, 1764500000123)
    ]
    assert warnings == []
    assert tail.poll() == ([], [])
    with path.open("a") as file:
        file.write(second[10:])
    points, _ = tail.poll()
    assert [(p.seq, p.step, p.value) for p in points] == [(2, 2, 0.25)]


def test_malformed_line_is_skipped_with_a_warning_and_uses_its_seq(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        metric("loss", 1, 0.5) + "{not json\n" + '{"name": "acc", "value": "high"}\n' + metric("acc", 3, 0.9)
    )
    points, warnings = MetricsTail(path).poll()
    assert [(p.seq, p.name) for p in points] == [(1, "loss"), (4, "acc")]
    assert len(warnings) == 2
    assert "line 2" in warnings[0] and "not JSON" in warnings[0]
    assert "line 3" in warnings[1] and "value" in warnings[1]


def test_a_line_longer_than_a_read_is_skipped_with_a_warning_and_the_next_ones_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "MAX_READ_BYTES", 100)
    path = tmp_path / "metrics.jsonl"
    path.write_text(metric("loss", 1, 0.5) + "x" * 250)
    tail = MetricsTail(path)
    points, warnings = tail.poll()
    assert [p.seq for p in points] == [1] and warnings == []
    points, warnings = tail.poll()  # 100 bytes and no newline: it can only be skipped
    assert points == [] and warnings == ["mwms-agent: skipped metrics line 2 (longer than 100 bytes)"]
    assert tail.poll() == ([], [])  # still inside it
    with path.open("a") as file:
        file.write("x" * 30 + "\n" + metric("loss", 3, 0.25))
    polls = [tail.poll() for _ in range(3)]  # reads of 100 bytes: past its end, then the next line
    assert [(p.seq, p.step) for points, _ in polls for p in points] == [(3, 3)]
    assert [w for _, warnings in polls for w in warnings] == []
