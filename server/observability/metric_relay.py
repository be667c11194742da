"""Metric updates made in a helper process, replayed in the coordinator's registry (the one /metrics shows).

The scheduler process (server/live/scheduler_worker.py) runs the same services as the coordinator, and
they count what they do (restarts, preemptions, queue waits, poisoned rows) in prometheus_client metrics,
which would stay in that process. `capture()` there turns every counter increment and histogram
observation into a record instead; the records travel with the pass's reply, and `replay()` in the
coordinator applies them to the metric of the same name, so a series counts the same whichever process
made the change. Gauges are not relayed: the coordinator computes its gauges itself at scrape time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram

log = logging.getLogger("mwms.server.metrics")
# One record: (kind "inc" | "observe", metric name, label values, amount).
Record = tuple[str, str, list[str], float]
# Records kept between two replies at most: a pass changes a few hundred series at most; past this the
# oldest are dropped (and counted in the log) rather than growing without bound.
MAX_RECORDS = 100_000


class Capture:
    """The records made since the last `take()`."""

    def __init__(self) -> None:
        self._records: list[Record] = []
        self.dropped = 0

    def add(self, record: Record) -> None:
        if len(self._records) >= MAX_RECORDS:
            self.dropped += 1
            return
        self._records.append(record)

    def take(self) -> list[Record]:
        records, self._records = self._records, []
        return records


def capture() -> Capture:
    """From now on, in this process, counters and histograms record instead of counting (helper processes
    only: their own registry is never scraped)."""
    sink = Capture()

    def inc(self: Counter, amount: float = 1, exemplar: Any = None) -> None:
        sink.add(("inc", self._name, list(self._labelvalues), float(amount)))

    def observe(self: Histogram, amount: float, exemplar: Any = None) -> None:
        sink.add(("observe", self._name, list(self._labelvalues), float(amount)))

    Counter.inc = inc  # type: ignore[method-assign]
    Histogram.observe = observe  # type: ignore[method-assign]
    return sink


def _metrics_by_name() -> dict[str, Counter | Histogram]:
    found: dict[str, Counter | Histogram] = {}
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - the registry has no public walk
        if isinstance(collector, (Counter, Histogram)):
            found[collector._name] = collector  # noqa: SLF001
    return found


def replay(records: Iterable[Any]) -> int:
    """Applies records from a helper process to this process's metrics; returns how many were applied.

    A record naming a metric this process does not have, or malformed, is skipped (logged at debug)."""
    metrics: dict[str, Counter | Histogram] | None = None
    applied = 0
    for record in records:
        try:
            kind, name, labels, amount = record
            if metrics is None:
                metrics = _metrics_by_name()
            metric = metrics[name]
            target = metric.labels(*labels) if labels else metric
            if kind == "inc" and isinstance(metric, Counter):
                target.inc(float(amount))  # type: ignore[union-attr]
            elif kind == "observe" and isinstance(metric, Histogram):
                target.observe(float(amount))  # type: ignore[union-attr]
            else:
                raise ValueError(f"{kind} on {type(metric).__name__}")
            applied += 1
        except Exception as error:  # noqa: BLE001 - a metric never fails the pass it came with
            log.debug("metric record %r from the scheduler process skipped: %s", record, error)
    return applied
