"""The metrics line: one metric point as mwms_runtime writes it to MWMS_METRICS_FILE and the agent reads it.

One JSON object per line, UTF-8, ending in "\\n"::

    {"name": "loss", "step": 120, "value": 0.25, "time": 1764500000.123}

- ``name``: 1-200 characters, no NUL.
- ``step``: an integer in [-2**31, 2**31 - 1] (the coordinator's database column); an integral float
  such as ``120.0`` is read as 120. Missing: 0.
- ``value``: a JSON number, or one of the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``: JSON has no
  non-finite numbers, and a diverging loss is exactly what a user must see. Reading also accepts what
  other writers produce: the bare tokens ``NaN``/``Infinity``/``-Infinity`` of Python's ``json.dumps``,
  and ``null`` (older mwms_runtime versions wrote it for any non-finite value), which reads as NaN.
- ``time``: unix seconds in [0, 253402300799] (1970 to the end of year 9999). Missing: the time it is read.
  A time outside that range is refused, not clamped: a point is stored as written or not at all.

Two axes. A series whose name starts with ``epoch_`` (``EPOCH_PREFIX``) is a **per-epoch** series: its
``step`` is the epoch index, 0-based as Keras passes it and as Keras' TensorBoard callback records it
(mwms_runtime's MetricsCallback writes fit's epoch logs so: ``epoch_loss`` at 0, 1, ...). Every other
series is **per step** (training steps or batches). The two never share an axis: the coordinator leaves
per-epoch series out of a job's step, the dashboard charts them against "epoch", ``mwms metrics`` prints
them in a table of their own and the client returns them apart (``Metrics.per_epoch()``,
``Metrics.per_step()``). ``axis(name)`` is the one place that decides.

The REST API uses the same three strings for non-finite values (``json_value``), so a NaN written by a
training program reaches ``GET /api/v1/jobs/{id}/metrics``, ``mwms metrics`` and the chart as ``"NaN"``.
The coordinator checks the same bounds (``point_problem``) on what agents send, so a point it refuses
here would be refused there too.

Dependency-free (standard library only): mwms_runtime imports it inside training programs.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Final, Literal

NonFinite = Literal["NaN", "Infinity", "-Infinity"]
NON_FINITE: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

# Also the coordinator's bound on job and agent names (server/limits.py MAX_NAME_CHARS): its columns hold 200.
MAX_NAME_LENGTH = 200
MIN_STEP = -(2**31)
MAX_STEP = 2**31 - 1
MIN_TIME = 0.0
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z, the last second Python's datetime can hold


# Series named with this prefix are indexed by epoch, every other by step (see the module docstring).
EPOCH_PREFIX = "epoch_"
AXIS_STEP: Final = "step"
AXIS_EPOCH: Final = "epoch"


def axis(name: str) -> Literal["step", "epoch"]:
    """The axis a series of this name is indexed by: AXIS_EPOCH for ``epoch_*`` names, else AXIS_STEP."""
    return AXIS_EPOCH if name.startswith(EPOCH_PREFIX) else AXIS_STEP


class InvalidMetricLine(ValueError):
    """A line (or point) that breaks the contract; the message says which field and why."""


@dataclass(frozen=True)
class MetricLine:
    """One decoded metric point."""

    name: str
    step: int
    value: float
    time: float


def json_value(value: float) -> float | NonFinite:
    """``value`` as JSON can carry it: the number itself, or "NaN" / "Infinity" / "-Infinity"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def parse_value(raw: object) -> float:
    """A JSON value as written by any writer: a number, a non-finite string, a bare token, or null (NaN)."""
    if raw is None:
        return math.nan
    if isinstance(raw, str):
        if raw in NON_FINITE:
            return NON_FINITE[raw]
        raise InvalidMetricLine(f'value {raw[:20]!r} is not a number (nor "NaN", "Infinity", "-Infinity")')
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidMetricLine("value is not a number")
    try:
        return float(raw)
    except OverflowError:  # a JSON integer too large for a double
        raise InvalidMetricLine("value is too large for a double") from None


def name_problem(name: object) -> str | None:
    """Why `name` cannot be a metric name, or None."""
    if not isinstance(name, str) or not name:
        return "no name"
    if len(name) > MAX_NAME_LENGTH:
        return f"name is longer than {MAX_NAME_LENGTH} characters"
    if "\x00" in name:
        return "name contains a NUL character"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid Unicode"
    return None


def step_problem(step: int) -> str | None:
    """Why `step` cannot be stored, or None."""
    if not MIN_STEP <= step <= MAX_STEP:
        return f"step {step} is outside [{MIN_STEP}, {MAX_STEP}]"
    return None


def time_problem(seconds: float) -> str | None:
    """Why `seconds` (unix time) cannot be a point's time, or None."""
    if not math.isfinite(seconds) or not MIN_TIME <= seconds <= MAX_TIME:
        return f"time {seconds:g} is outside [0, {MAX_TIME:.0f}] unix seconds"
    return None


def point_problem(name: object, step: int, seconds: float) -> str | None:
    """Why a point cannot be stored, or None: the bounds above, shared by the agent and the coordinator."""
    return name_problem(name) or step_problem(step) or time_problem(seconds)


def encode(name: str, step: int, value: float, when: float) -> str:
    """The line (with its "\\n") for one point; raises InvalidMetricLine for a point the reader would refuse."""
    problem = point_problem(name, step, when)
    if problem:
        raise InvalidMetricLine(problem)
    record = {"name": name, "step": step, "value": json_value(float(value)), "time": when}
    return json.dumps(record, allow_nan=False, ensure_ascii=False) + "\n"


def _parse_step(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidMetricLine("step is not a number")
    if isinstance(raw, float):
        if not math.isfinite(raw) or not raw.is_integer():
            raise InvalidMetricLine(f"step {raw!r} is not an integer")
        raw = int(raw)
    problem = step_problem(raw)
    if problem:
        raise InvalidMetricLine(problem)
    return raw


def _parse_time(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise InvalidMetricLine("time is not a number")
    try:
        seconds = float(raw)
    except OverflowError:
        raise InvalidMetricLine("time is not a finite number") from None
    problem = time_problem(seconds)
    if problem:
        raise InvalidMetricLine(problem)
    return seconds


def decode(raw: bytes | str, now: float | None = None) -> MetricLine:
    """One line (without or with its "\\n"); raises InvalidMetricLine saying what is wrong."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidMetricLine("not JSON") from None
    if not isinstance(record, dict):
        raise InvalidMetricLine("not a JSON object")
    name = record.get("name")
    problem = name_problem(name)
    if problem:
        raise InvalidMetricLine(problem)
    assert isinstance(name, str)
    step = _parse_step(record.get("step", 0))
    if "value" not in record:
        raise InvalidMetricLine("no value")
    value = parse_value(record["value"])
    when = _parse_time(record["time"]) if "time" in record else (time.time() if now is None else now)
    return MetricLine(name=name, step=step, value=value, time=when)
