"""Tailing the metrics file: complete lines only, seq = line number, malformed lines skipped with a warning."""

from __future__ import annotations

import json
from pathlib import Path

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
