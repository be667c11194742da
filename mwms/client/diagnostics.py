"""What the coordinator found out about a job's gang: its preflight results and its stack dumps.

Each keeps the object as the API sent it in `raw` (the CLI prints that with --json); the per-task details
stay the API's objects (see the coordinator's /docs: PreflightOut, StackDumpsOut).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mwms.client.models import parse_time


@dataclass(frozen=True)
class Preflight:
    """A job's preflight check results: per attempt {"attempt", "ok", "results": [{"task_index", "ok",
    "message", "report"}, ...]}, oldest attempt first; no attempts when no check ran."""

    job_id: str
    attempts: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Preflight:
        """The Preflight an API object describes (kept as `raw`)."""
        return cls(job_id=str(raw.get("job_id") or ""), attempts=list(raw.get("attempts") or []), raw=raw)

    @property
    def latest_results(self) -> list[dict[str, Any]]:
        """The per-task results of the newest attempt that ran a check; [] when none did."""
        return list(self.attempts[-1]["results"]) if self.attempts else []


@dataclass(frozen=True)
class StackDump:
    """The Python stacks of every running task of an attempt, taken at one moment: `cause` is "request"
    (someone asked) or "hang" (hang detection); `complete` once every task asked has answered. `tasks`
    are the API's per-task objects (agent, pid, method, in_collective, threads with their frames)."""

    id: str
    job_id: str
    attempt: int
    cause: str
    requested_by: str
    requested_at: datetime | None
    complete: bool
    tasks: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> StackDump:
        """The StackDump an API object describes (kept as `raw`)."""
        return cls(
            id=str(raw["id"]),
            job_id=str(raw.get("job_id") or ""),
            attempt=int(raw.get("attempt") or 0),
            cause=str(raw.get("cause") or ""),
            requested_by=str(raw.get("requested_by") or ""),
            requested_at=parse_time(raw.get("requested_at")),
            complete=bool(raw.get("complete")),
            tasks=list(raw.get("tasks") or []),
            raw=raw,
        )
