"""Gauges of the cluster's state, read when Prometheus scrapes: one short read transaction per scrape.

`ClusterGauges` is a custom collector over services.observing.cluster_counts (a fixed number of aggregate queries,
whatever the number of jobs and agents) plus what the coordinator holds in memory (connected agent
streams). The queue and the teams' use of the cluster (services.observing.cluster_counts.count_sharing) and the lost
agents by name (observability.lost_agents, at most MAX_LOST_AGENTS_LABELLED) are read in the same
transaction. The `team` label is bounded: at most MAX_TEAMS_LABELLED teams get series of
their own (those with a quota first, then the biggest users of the cluster and of the queue), the rest
are summed under team="other".

Every replica on one database exports the same cluster gauges (all but mwms_agent_streams,
mwms_replica_leads_loop and the scrape's own two), so queries over several replicas take them once with
`max` rather than `sum` (deploy/prometheus/mwms-alerts.yml, the Grafana dashboard). The collector lives in a
registry of the app's own, not the process-wide one: every app (tests start several in one process) reads
its own database. `render` joins both registries into one /metrics page.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mwms.priorities import PRIORITY_BANDS
from mwms.server.db.engine import Database
from mwms.server.live.pass_locks import LOOPS
from mwms.server.observability.lost_agents import MAX_LOST_AGENTS_LABELLED, lost_agent_gauge, lost_agent_names
from mwms.server.services.fleet.agents import AGENT_STATES
from mwms.server.services.fleet.replicas import ReplicaView, list_replicas
from mwms.server.services.observing.cluster_counts import (
    LIVE_TASK_STATES,
    SharingCounts,
    count_cluster,
    count_sharing,
)
from mwms.server.states import JobState

log = logging.getLogger("mwms.server.metrics")
LIVENESS_STATES = AGENT_STATES  # online, stopped (said goodbye), lost, removed
DEVICE_KINDS = ("cpu", "gpu")
# Series per team-labelled gauge stay bounded however many teams (users without one) there are.
MAX_TEAMS_LABELLED = 200
OTHER_TEAMS = "other"


def _gauge(name: str, documentation: str, label: str, values: dict[str, int], known: Iterable[str]) -> Metric:
    """A labelled gauge with a 0 for each known label value that has no rows, so series never vanish."""
    gauge = GaugeMetricFamily(name, documentation, labels=[label])
    for value in sorted(set(known) | set(values)):
        gauge.add_metric([value], values.get(value, 0))
    return gauge


def _team_labels(counts: SharingCounts, limit: int = MAX_TEAMS_LABELLED) -> dict[str, str]:
    """Each team's `team` label: its name for the first `limit` (quota first, then by devices held and
    jobs queued), OTHER_TEAMS for the rest. A real team named "other" shares that series."""
    teams = set(counts.queued) | set(counts.in_use) | set(counts.quotas)

    def rank(team: str) -> tuple[bool, int, int, int, str]:
        held = counts.in_use.get(team, {})
        queued = sum(counts.queued.get(team, {}).values())
        return (team not in counts.quotas, -held.get("gpu", 0), -held.get("cpu", 0), -queued, team)

    ordered = sorted(teams, key=rank)
    return {team: team if i < limit else OTHER_TEAMS for i, team in enumerate(ordered)}


def _summed(values: dict[str, dict[str, int]], labels: dict[str, str]) -> dict[str, dict[str, int]]:
    """team -> key -> value summed by team label."""
    summed: dict[str, dict[str, int]] = {}
    for team, by_key in values.items():
        target = summed.setdefault(labels[team], {})
        for key, value in by_key.items():
            target[key] = target.get(key, 0) + value
    return summed


def sharing_gauges(counts: SharingCounts, limit: int = MAX_TEAMS_LABELLED) -> Iterator[Metric]:
    """The queue by band and team, and each team's devices held and quota, with bounded team labels."""
    labels = _team_labels(counts, limit)
    shown = sorted(set(labels.values()))
    queued = _summed(counts.queued, labels)
    queue = GaugeMetricFamily(
        "mwms_queue_jobs",
        "Jobs waiting to be placed (PENDING, RESTARTING, PREEMPTING) by priority band "
        "(low < 250 <= normal < 750 <= high) and team",
        labels=["band", "team"],
    )
    for team in shown:
        for band in PRIORITY_BANDS:
            queue.add_metric([band, team], queued.get(team, {}).get(band, 0))
    yield queue
    in_use = _summed(counts.in_use, labels)
    used = GaugeMetricFamily(
        "mwms_team_devices_in_use",
        "Devices (GPUs, CPU slots) that a team's tasks hold, as its quota counts them",
        labels=["team", "kind"],
    )
    for team in shown:
        for kind in DEVICE_KINDS:
            used.add_metric([team, kind], in_use.get(team, {}).get(kind, 0))
    yield used
    quotas = _summed(counts.quotas, labels)
    quota = GaugeMetricFamily(
        "mwms_team_quota_devices",
        "A team's quota of devices by kind, for the kinds it caps (teams without a quota have none)",
        labels=["team", "kind"],
    )
    for team in sorted(quotas):
        for kind in DEVICE_KINDS:
            if kind in quotas[team]:
                quota.add_metric([team, kind], quotas[team][kind])
    yield quota


def replica_gauges(views: list[ReplicaView], loops_here: list[str]) -> Iterator[Metric]:
    """The replicas alive on the database (each labelled: they are few), and the loops this one runs."""
    alive = [v for v in views if v.alive]
    count = GaugeMetricFamily(
        "mwms_replicas", "Coordinator replicas alive on this database (seen within 10 s)"
    )
    count.add_metric([], len(alive))
    yield count
    info = GaugeMetricFamily(
        "mwms_replica_info",
        "1 for each replica alive, with what it serves",
        labels=["replica", "version", "serve"],
    )
    held = GaugeMetricFamily(
        "mwms_replica_agent_streams", "Agent streams each replica alive holds", labels=["replica"]
    )
    for view in alive:
        info.add_metric([view.name, view.version, view.serve], 1)
        held.add_metric([view.name], view.agents_held)
    yield info
    yield held
    loops = GaugeMetricFamily(
        "mwms_replica_leads_loop",
        "1 for each background loop this replica leads (holds the lock of)",
        labels=["loop"],
    )
    for name in LOOPS:
        loops.add_metric([name], 1 if name in loops_here else 0)
    yield loops


class ClusterGauges(Collector):
    """Jobs, tasks, agents and devices as gauges, counted at scrape time."""

    def __init__(
        self,
        db: Database,
        connected_agents: Callable[[], int],
        loops_here: Callable[[], list[str]] | None = None,
    ) -> None:
        self._db = db
        self._connected_agents = connected_agents
        self._loops_here = loops_here or list

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to check at registration, and no database read then

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            with self._db.read() as session:
                counts = count_cluster(session)
                sharing = count_sharing(session)
                lost = lost_agent_names(session, MAX_LOST_AGENTS_LABELLED)
                replicas = list_replicas(session)
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
            "Agents by liveness: online (heard from within the agent timeout), stopped (said goodbye: a clean "
            "stop), lost, removed by an admin",
            "state",
            counts.agents_by_liveness,
            LIVENESS_STATES,
        )
        yield from lost_agent_gauge(lost)
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
        yield from sharing_gauges(sharing)
        yield from replica_gauges(replicas, self._loops_here())
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


def cluster_registry(
    db: Database, connected_agents: Callable[[], int], loops_here: Callable[[], list[str]] | None = None
) -> CollectorRegistry:
    """A registry with one app's cluster gauges."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterGauges(db, connected_agents, loops_here))
    return registry


def render(cluster: CollectorRegistry | None) -> bytes:
    """The /metrics page: the process-wide registry (counters, histograms, process) and the cluster's."""
    page = generate_latest(REGISTRY)
    return page + generate_latest(cluster) if cluster is not None else page
