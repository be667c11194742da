"""Typed views of the API's JSON objects: metric points, log lines, artifacts, agents.

Each keeps the object as the API sent it in `raw`, so nothing the API adds later is lost.

Non-finite numbers: the API sends a metric `value` (and a job's `loss`) as a JSON number or as one of
the strings "NaN", "Infinity", "-Infinity" (JSON has no literal for them; see mwms.metrics_line). The
client turns those back into `float("nan")`, `float("inf")` and `float("-inf")`, so values are always
floats that numpy and pandas understand; `raw` keeps the API's form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from mwms.metrics_line import parse_value


def parse_number(value: Any) -> float | None:
    """A JSON number or "NaN"/"Infinity"/"-Infinity" as a float; None (not reported) stays None."""
    return None if value is None else parse_value(value)


def parse_time(value: str | None) -> datetime | None:
    """An API timestamp as an aware datetime (naive ones are UTC)."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class MetricPoint:
    """One reported value of a metric: `value` is a float, NaN and ±inf included."""

    name: str
    step: int
    value: float
    attempt: int
    wall_time: datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> MetricPoint:
        """The MetricPoint an API object describes (kept as `raw`)."""
        return cls(
            name=str(raw["name"]),
            step=int(raw["step"]),
            value=parse_value(raw.get("value")),  # null (older coordinators) reads as NaN
            attempt=int(raw.get("attempt") or 1),
            wall_time=parse_time(raw.get("wall_time")),
            raw=raw,
        )


class Metrics(list[MetricPoint]):
    """A job's metric points (a list), ordered by name, attempt and step; `to_pandas()` for a DataFrame."""

    def names(self) -> list[str]:
        """The metric names present, sorted."""
        return sorted({point.name for point in self})

    def to_pandas(self) -> Any:
        """A pandas DataFrame with columns name, step, value, attempt, wall_time (one row per point).

        For one column per metric: `df.pivot_table(index="step", columns="name", values="value")`.
        Needs pandas, which mwms does not install: `pip install pandas`.
        """
        try:
            import pandas
        except ImportError:
            raise ImportError(
                "Metrics.to_pandas() needs pandas, which mwms does not install: pip install pandas "
                "(or use the points as a list: each has name, step, value, attempt, wall_time)"
            ) from None
        rows = [
            {
                "name": point.name,
                "step": point.step,
                "value": point.value,
                "attempt": point.attempt,
                "wall_time": point.wall_time,
            }
            for point in self
        ]
        return pandas.DataFrame(rows, columns=["name", "step", "value", "attempt", "wall_time"])


@dataclass(frozen=True)
class LogLine:
    """One line a task wrote; `stream` is "stdout" or "stderr", `id` a cursor for newer lines."""

    id: int
    task: int
    attempt: int
    stream: str
    text: str
    at: datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> LogLine:
        """The LogLine an API object describes (kept as `raw`)."""
        return cls(
            id=int(raw.get("id") or 0),
            task=int(raw.get("task") or 0),
            attempt=int(raw.get("attempt") or 1),
            stream=str(raw.get("stream") or "stdout"),
            text=str(raw.get("text") or "").rstrip("\n"),
            at=parse_time(raw.get("at")),
            raw=raw,
        )


@dataclass(frozen=True)
class Artifact:
    """A file the job's chief saved in MWMS_OUTPUT_DIR (a model, a checkpoint, a report)."""

    path: str
    size: int
    sha256: str
    attempt: int
    created_at: datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Artifact:
        """The Artifact an API object describes (kept as `raw`)."""
        return cls(
            path=str(raw["path"]),
            size=int(raw.get("size") or 0),
            sha256=str(raw.get("sha256") or ""),
            attempt=int(raw.get("attempt") or 1),
            created_at=parse_time(raw.get("created_at")),
            raw=raw,
        )


@dataclass(frozen=True)
class Agent:
    """A machine running `mwms agent`: whether it is online, its devices and what runs on them."""

    id: str
    name: str
    address: str
    online: bool
    devices: list[dict[str, Any]]
    devices_free: int
    tasks: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Agent:
        """The Agent an API object describes (kept as `raw`)."""
        return cls(
            id=str(raw["id"]),
            name=str(raw.get("name") or ""),
            address=str(raw.get("address") or ""),
            online=bool(raw.get("online")),
            devices=list(raw.get("devices") or []),
            devices_free=int(raw.get("devices_free") or 0),
            tasks=list(raw.get("tasks") or []),
            raw=raw,
        )
