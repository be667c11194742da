"""Typed views of the API's JSON objects: metric points, log lines, artifacts, agents, the queue, teams.

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

from mwms.metrics_line import AXIS_EPOCH, AXIS_STEP, axis, parse_value


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
    """One reported value of a metric: `value` is a float, NaN and ±inf included.

    `step` is an epoch index for a per-epoch series (`axis == "epoch"`: an `epoch_*` name, as fit's epoch
    logs are recorded), a training step otherwise (see mwms.metrics_line).
    """

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

    @property
    def axis(self) -> str:
        """The series' axis: "epoch" when per epoch (`step` is the 0-based epoch index), else "step"."""
        return axis(self.name)


class Metrics(list[MetricPoint]):
    """A job's metric points (a list), ordered by name, attempt and step; `to_pandas()` for a DataFrame.

    Per-step and per-epoch series share no axis: `per_step()` and `per_epoch()` keep them apart.
    """

    def names(self) -> list[str]:
        """The metric names present, sorted."""
        return sorted({point.name for point in self})

    def per_step(self) -> Metrics:
        """The points of per-step series (training steps), in the same order."""
        return Metrics(point for point in self if point.axis == AXIS_STEP)

    def per_epoch(self) -> Metrics:
        """The points of per-epoch series (`epoch_*`, `step` = 0-based epoch index), in the same order."""
        return Metrics(point for point in self if point.axis == AXIS_EPOCH)

    def to_pandas(self) -> Any:
        """A pandas DataFrame with columns name, step, value, attempt, wall_time (one row per point).

        For one column per metric: `df.pivot_table(index="step", columns="name", values="value")`, on
        `per_step().to_pandas()` or `per_epoch().to_pandas()` so that steps and epochs do not mix.
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
    """One line a task wrote; `stream` is "stdout" or "stderr", `id` a cursor for newer lines; `redraw`: a
    newer state of the line before it of this task and stream (a `\\r` progress bar), which it replaces."""

    id: int
    task: int
    attempt: int
    stream: str
    text: str
    at: datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    redraw: bool = False

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
            redraw=bool(raw.get("redraw")),
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

    @property
    def memory_bytes(self) -> int:
        """The memory it offers its tasks in all; 0 when it did not report it."""
        return int(self.raw.get("memory_bytes") or 0)

    @property
    def task_isolation(self) -> str:
        """How it confines its tasks, as it registered it (e.g. "bubblewrap"); "" when it did not say."""
        return str(self.raw.get("task_isolation") or "")

    @property
    def cordoned(self) -> bool:
        """True when an admin cordoned (or drained) it: nothing new is placed on it."""
        return bool(self.raw.get("cordoned"))

    @property
    def draining(self) -> bool:
        """True while it is drained: its jobs were preempted (or are let finish) to run elsewhere."""
        return bool(self.raw.get("draining"))

    @property
    def drained(self) -> bool:
        """True once it is draining and no task holds its devices: the machine may be taken away."""
        return bool(self.raw.get("drained"))


@dataclass(frozen=True)
class QueueEntry:
    """A waiting job in the scheduler's order: its place, and why it waits (`waiting["kind"]`,
    `waiting["message"]`) with, where known, when it is estimated to start."""

    position: int
    job_id: str
    name: str
    state: str
    team: str
    submitted_by: str
    priority: int
    workers: int
    gpus_per_worker: int
    waiting: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> QueueEntry:
        """The QueueEntry an API object describes (kept as `raw`)."""
        return cls(
            position=int(raw.get("position") or 0),
            job_id=str(raw["job_id"]),
            name=str(raw.get("name") or ""),
            state=str(raw.get("state") or ""),
            team=str(raw.get("team") or ""),
            submitted_by=str(raw.get("submitted_by") or ""),
            priority=int(raw.get("priority") or 0),
            workers=int(raw.get("workers") or 0),
            gpus_per_worker=int(raw.get("gpus_per_worker") or 0),
            waiting=dict(raw.get("waiting") or {}),
            raw=raw,
        )

    @property
    def reason(self) -> str:
        """Why it waits, in words."""
        return str(self.waiting.get("message") or "")

    @property
    def estimated_start(self) -> datetime | None:
        """When it is estimated to start (see `estimate_basis`); None when nothing tells. From a coordinator
        that sends no estimate of its own: the scheduler's reservation time (max_runtime)."""
        if "estimate_basis" in self.raw:
            return parse_time(self.raw.get("estimated_start"))
        return parse_time(self.waiting.get("estimated_start"))

    @property
    def estimate_basis(self) -> str:
        """What `estimated_start` rests on: "max_runtime", "similar_jobs" (how long the same user's jobs of
        that shape usually ran), "overdue" (running jobs ran past that: any time now) or "unknown"."""
        if "estimate_basis" in self.raw:
            return str(self.raw.get("estimate_basis") or "unknown")
        return "max_runtime" if self.waiting.get("estimated_start") else "unknown"


@dataclass(frozen=True)
class Team:
    """A team: its members, its quota ({"gpus", "cpu_slots"}, None for no quota; a None value: no cap of
    that kind), the devices its jobs hold now ({"gpus", "cpu_slots"}), and its fair share over time: its
    share ({"gpus", "cpu_slots"}), the device-hours its jobs held, decayed with the coordinator's half-life
    (`usage_device_hours`), and its standing, that usage over its share in hours of its whole share (lower
    goes first within a priority; None from a coordinator that does not say)."""

    name: str
    members: list[str]
    quota: dict[str, int | None] | None
    in_use: dict[str, int]
    raw: dict[str, Any] = field(repr=False, compare=False)
    share: dict[str, float] = field(default_factory=dict)
    usage_device_hours: dict[str, float] = field(default_factory=dict)
    standing: float | None = None

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Team:
        """The Team an API object describes (kept as `raw`)."""
        quota = raw.get("quota")
        in_use = raw.get("in_use") or {}

        def amounts(key: str) -> dict[str, float]:
            given = raw.get(key) or {}
            return {kind: float(given.get(kind) or 0) for kind in ("gpus", "cpu_slots")} if given else {}

        standing = raw.get("standing")
        return cls(
            name=str(raw["team"]),
            members=[str(member) for member in raw.get("members") or []],
            quota=None if quota is None else {"gpus": quota.get("gpus"), "cpu_slots": quota.get("cpu_slots")},
            in_use={"gpus": int(in_use.get("gpus") or 0), "cpu_slots": int(in_use.get("cpu_slots") or 0)},
            raw=raw,
            share=amounts("share"),
            usage_device_hours=amounts("usage_device_hours"),
            standing=None if standing is None else float(standing),
        )
