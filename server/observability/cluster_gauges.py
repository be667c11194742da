"""Gauges of the cluster's state, read when Prometheus scrapes: one short read transaction per scrape.

`ClusterGauges` is a custom collector over services.cluster_counts (a fixed number of aggregate queries,
whatever the number of jobs and agents) plus what the coordinator holds in memory (connected agent
streams). It lives in a registry of the app's own, not the process-wide one: every app (tests start
several in one process) reads its own database. `render` joins both registries into one /metrics page.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from server.db.engine import Database
from server.services.cluster_counts import LIVE_TASK_STATES, count_cluster
from server.states import JobState

log = logging.getLogger("mwms.server.metrics")
LIVENESS_STATES = ("online", "lost", "removed")
DEVICE_KINDS = ("cpu", "gpu")


def _gauge(name: str, documentation: str, label: str, values: dict[str, int], known: Iterable[str]) -> Metric:
    """A labelled gauge with a 0 for each known label value that has no rows, so series never vanish."""
    gauge = GaugeMetricFamily(name, documentation, labels=[label])
    for value in sorted(set(known) | set(values)):
        gauge.add_metric([value], values.get(value, 0))
    return gauge


class ClusterGauges(Collector):
    """Jobs, tasks, agents and devices as gauges, counted at scrape time."""

    def __init__(self, db: Database, connected_agents: Callable[[], int]) -> None:
        self._db = db
        self._connected_agents = connected_agents

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to check at registration, and no database read then

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            with self._db.read() as session:
                counts = count_cluster(session)
        except Exception:  # noqa: BLE001 - a scrape still shows the process and counter metrics
            log.exception("counting the cluster for /metrics failed")
            up = GaugeMetricFamily("mwms_cluster_scrape_ok", "1 when the cluster gauges could be read")
            up.add_metric([], 0)
            yield up
            return
        yield _gauge("mwms_jobs", "Jobs by state", "state", counts.jobs_by_state, (s.value for s in JobState))
        yield _gauge(
            "mwms_tasks",
            "Tasks not ended (the workers running or starting now) by state",
            "state",
            counts.tasks_by_state,
            LIVE_TASK_STATES,
        )
        yield _gauge(
            "mwms_agents",
            "Agents by liveness: online (heard from within the agent timeout), lost, removed by an admin",
            "state",
            counts.agents_by_liveness,
            LIVENESS_STATES,
        )
        yield _gauge(
            "mwms_devices",
            "Devices of online agents by kind (CPU slots, GPUs)",
            "kind",
            counts.devices_by_kind,
            DEVICE_KINDS,
        )
        yield _gauge(
            "mwms_devices_used",
            "Devices of online agents that live tasks hold, by kind",
            "kind",
            counts.devices_used_by_kind,
            DEVICE_KINDS,
        )
        streams = GaugeMetricFamily("mwms_agent_streams", "Agents with an open stream to this coordinator")
        streams.add_metric([], self._connected_agents())
        yield streams
        up = GaugeMetricFamily("mwms_cluster_scrape_ok", "1 when the cluster gauges could be read")
        up.add_metric([], 1)
        yield up
        took = GaugeMetricFamily(
            "mwms_cluster_scrape_duration_seconds", "Time this scrape took to count the cluster's state"
        )
        took.add_metric([], time.perf_counter() - started)
        yield took


def cluster_registry(db: Database, connected_agents: Callable[[], int]) -> CollectorRegistry:
    """A registry with one app's cluster gauges."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterGauges(db, connected_agents))
    return registry


def render(cluster: CollectorRegistry | None) -> bytes:
    """The /metrics page: the process-wide registry (counters, histograms, process) and the cluster's."""
    page = generate_latest(REGISTRY)
    return page + generate_latest(cluster) if cluster is not None else page
