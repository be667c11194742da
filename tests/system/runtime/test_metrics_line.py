"""The metrics line (mwms/metrics_line.py): the runtime's writer and the agent's reader round-trip every edge value.

The writer is mwms_runtime's real MetricsWriter, the reader the agent's real MetricsTail; between them is a file.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mwms import metrics_line
from mwms.worker_agent.metrics import MetricsTail
from mwms_runtime.writer import MetricsRecord, MetricsWriter

TIME = 1764500000.125
EDGE_VALUES = [
    0.0,
    -0.0,
    1.0,
    -2.5,
    math.nan,
    math.inf,
    -math.inf,
    sys.float_info.max,
    -sys.float_info.max,
    sys.float_info.min,  # smallest normal
    5e-324,  # smallest subnormal
    1e-300,
    0.1 + 0.2,
    2.0**53 + 1,
]


def same(a: float, b: float) -> bool:
    """Bit-for-bit equal (NaN equals NaN, -0.0 differs from 0.0)."""
    return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("value", EDGE_VALUES, ids=repr)
def test_encode_decode_round_trips_every_value(value: float) -> None:
    line = metrics_line.encode("loss", 7, value, TIME)
    assert line.endswith("\n") and line.count("\n") == 1
    json.loads(line)  # valid JSON (no bare NaN/Infinity tokens)
    assert "NaN" not in line or '"NaN"' in line
    decoded = metrics_line.decode(line.encode())
    assert (decoded.name, decoded.step, decoded.time) == ("loss", 7, TIME)
    assert same(decoded.value, value), (value, decoded.value)


def test_non_finite_values_are_strings_in_the_line_and_in_json_value() -> None:
    assert json.loads(metrics_line.encode("x", 1, math.nan, TIME))["value"] == "NaN"
    assert json.loads(metrics_line.encode("x", 1, math.inf, TIME))["value"] == "Infinity"
    assert json.loads(metrics_line.encode("x", 1, -math.inf, TIME))["value"] == "-Infinity"
    assert metrics_line.json_value(1.5) == 1.5
    # The strings are what float() and JavaScript's Number() read back.
    for text in ("NaN", "Infinity", "-Infinity"):
        assert same(float(text), metrics_line.NON_FINITE[text])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"name": "loss", "step": 1, "value": NaN, "time": 1.0}', math.nan),  # Python's json.dumps
        ('{"name": "loss", "step": 1, "value": Infinity, "time": 1.0}', math.inf),
        ('{"name": "loss", "step": 1, "value": -Infinity, "time": 1.0}', -math.inf),
        ('{"name": "loss", "step": 1, "value": null, "time": 1.0}', math.nan),  # older mwms_runtime
        ('{"name": "loss", "step": 1.0, "value": 3, "time": 1}', 3.0),
        ('{"name": "loss", "value": 2.5, "time": 1.0}', 2.5),  # step defaults to 0
    ],
)
def test_other_writers_lines_are_read(raw: str, expected: float) -> None:
    assert same(metrics_line.decode(raw).value, expected)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"name": "", "step": 1, "value": 1.0}', "no name"),
        ('{"step": 1, "value": 1.0}', "no name"),
        ('{"name": "' + "n" * 201 + '", "step": 1, "value": 1.0}', "longer than 200"),
        ('{"name": "a\\u0000b", "step": 1, "value": 1.0}', "NUL"),
        ('{"name": "\\ud800", "step": 1, "value": 1.0}', "Unicode"),
        ('{"name": "loss", "step": 2147483648, "value": 1.0}', "step 2147483648 is outside"),
        ('{"name": "loss", "step": 1e30, "value": 1.0}', "outside"),
        ('{"name": "loss", "step": Infinity, "value": 1.0}', "not an integer"),
        ('{"name": "loss", "step": 1.5, "value": 1.0}', "not an integer"),
        ('{"name": "loss", "step": true, "value": 1.0}', "step is not a number"),
        ('{"name": "loss", "step": 1, "value": "high"}', "value 'high' is not a number"),
        ('{"name": "loss", "step": 1, "value": "nan"}', "is not a number"),
        ('{"name": "loss", "step": 1, "value": 1e999999}', None),  # json reads it as inf: kept
        ('{"name": "loss", "step": 1}', "no value"),
        ('{"name": "loss", "step": 1, "value": 1, "time": 1e18}', r"time 1e\+18 is outside"),
        ('{"name": "loss", "step": 1, "value": 1, "time": -1e18}', "outside"),
        ('{"name": "loss", "step": 1, "value": 1, "time": NaN}', "outside"),
        ('{"name": "loss", "step": 1, "value": 1, "time": "now"}', "time is not a number"),
        ("[1, 2]", "not a JSON object"),
        ("{not json", "not JSON"),
        ("[" * 100000, "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_lines_that_break_the_contract_are_refused_with_a_reason(
    raw: str | bytes, reason: str | None
) -> None:
    if reason is None:
        assert metrics_line.decode(raw).value == math.inf
        return
    with pytest.raises(metrics_line.InvalidMetricLine, match=reason):
        metrics_line.decode(raw)


def test_the_writer_refuses_what_the_reader_would_refuse() -> None:
    for name, step, when in (("", 1, TIME), ("x" * 201, 1, TIME), ("loss", 2**31, TIME), ("loss", 1, 1e18)):
        with pytest.raises(metrics_line.InvalidMetricLine):
            metrics_line.encode(name, step, 1.0, when)
    assert metrics_line.decode(
        metrics_line.encode("l" * 200, -(2**31), 1.0, metrics_line.MAX_TIME)
    ).step == -(2**31)


def test_runtime_writer_to_agent_reader_keeps_every_edge_value(tmp_path: Path, capfd) -> None:
    metrics_file = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(str(metrics_file), tensorboard_dir=None)
    for step, value in enumerate(EDGE_VALUES):
        writer.put(MetricsRecord(step=step, values={"loss": value}, time=TIME))
    writer.put(MetricsRecord(step=99, values={"": 1.0, "fine": 2.0}, time=TIME))  # empty name: not written
    writer.put(MetricsRecord(step=2**40, values={"loss": 1.0}, time=TIME))  # huge step: not written
    assert writer.flush(timeout=10)
    assert "not recorded: no name" in capfd.readouterr().err

    points, warnings = MetricsTail(metrics_file).poll()
    assert warnings == []
    assert [(p.seq, p.step) for p in points][: len(EDGE_VALUES)] == [
        (i + 1, i) for i in range(len(EDGE_VALUES))
    ]
    for point, value in zip(points, EDGE_VALUES, strict=False):
        assert same(point.value, value), (point.value, value)
        assert point.unix_ms == int(TIME * 1000)
    assert [(p.name, p.step, p.value) for p in points[len(EDGE_VALUES) :]] == [("fine", 99, 2.0)]


def test_agent_reader_skips_bad_lines_with_a_warning_and_keeps_going(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"name": "loss", "step": 1, "value": NaN, "time": 1.0}\n'
        '{"name": "loss", "step": Infinity, "value": 1.0}\n'  # used to raise OverflowError in the agent
        '{"name": "loss", "step": 3, "value": 1.0, "time": 1e18}\n'
        '{"name": "loss", "step": 4, "value": "-Infinity", "time": 2.0}\n'
    )
    points, warnings = MetricsTail(path).poll()
    assert [(p.seq, p.step) for p in points] == [(1, 1), (4, 4)]
    assert math.isnan(points[0].value) and points[1].value == -math.inf
    assert (
        len(warnings) == 2 and "line 2" in warnings[0] and "line 3" in warnings[1] and "time" in warnings[1]
    )


def test_the_contract_module_imports_nothing_but_the_standard_library() -> None:
    code = (
        "import sys; import mwms.metrics_line; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('google', 'grpc', 'pydantic', 'sqlalchemy', 'fastapi', 'numpy', 'tensorflow') "
        "or m.startswith(('mwms.server', 'mwms.worker_agent'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
