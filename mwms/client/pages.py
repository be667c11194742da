"""Pages of the API's listings: jobs, the queue, log lines. Each keeps the page as the API sent it in `raw`
(the CLI prints that with --json) and its entries as the client's typed objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mwms.client.job import Job
from mwms.client.models import LogLine, QueueEntry

if TYPE_CHECKING:
    from mwms.client.client import Client


def _count(value: Any, otherwise: int) -> int:
    """A page's `total`; the page's own length from an API that does not say."""
    return otherwise if value is None else int(value)


@dataclass(frozen=True)
class JobPage:
    """One page of GET /api/v1/jobs: `jobs` (summaries, newest first) and `total`, how many match in all."""

    jobs: list[Job]
    total: int
    offset: int
    limit: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, client: Client, raw: dict[str, Any]) -> JobPage:
        """The JobPage an API object describes (kept as `raw`); its jobs belong to `client`."""
        jobs = [Job(client, job) for job in raw.get("jobs") or []]
        return cls(
            jobs=jobs,
            total=_count(raw.get("total"), len(jobs)),
            offset=int(raw.get("offset") or 0),
            limit=int(raw.get("limit") or 0),
            raw=raw,
        )


@dataclass(frozen=True)
class QueuePage:
    """One page of GET /api/v1/queue: waiting jobs in the scheduler's order and `total`, how many wait."""

    entries: list[QueueEntry]
    total: int
    offset: int
    limit: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> QueuePage:
        """The QueuePage an API object describes (kept as `raw`)."""
        entries = [QueueEntry.from_api(entry) for entry in raw.get("jobs") or []]
        return cls(
            entries=entries,
            total=_count(raw.get("total"), len(entries)),
            offset=int(raw.get("offset") or 0),
            limit=int(raw.get("limit") or 0),
            raw=raw,
        )


@dataclass(frozen=True)
class LogPage:
    """One page of a job's log lines, oldest first; `next_after` is the cursor for newer lines (None when
    the API did not say)."""

    lines: list[LogLine]
    next_after: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> LogPage:
        """The LogPage an API object describes (kept as `raw`)."""
        cursor = raw.get("next_after")
        return cls(
            lines=[LogLine.from_api(line) for line in raw.get("lines") or []],
            next_after=None if cursor is None else int(cursor),
            raw=raw,
        )
