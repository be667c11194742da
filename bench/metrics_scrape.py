"""What one Prometheus scrape of /metrics costs with 100,000 finished jobs and 1,000 agents.

Seeds a coordinator's database with bench/jobs_at_volume.py's rows (finished jobs with attempts, tasks,
points and lines, and a few live jobs), adds agents up to 1,000 (GPU hosts with 8 devices each, online),
then times `count_cluster` (the four aggregate queries behind the gauges) on its own, and GET /metrics
of a real `mwms server` on that database.

Usage: python bench/metrics_scrape.py [--jobs 100000] [--agents 1000] [--requests 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from jobs_at_volume import seed, timed  # noqa: E402

from mwms.server.db.engine import Database  # noqa: E402
from mwms.server.db.models import Agent, utcnow  # noqa: E402
from mwms.server.services.observing.cluster_counts import count_cluster  # noqa: E402
from mwms_testkit.cluster import Cluster, free_port  # noqa: E402

TARGET_SCRAPE_P99_MS = 100.0  # Prometheus scrapes every 15-60 s; a tenth of a second is invisible


def add_agents(url: str, total: int) -> None:
    """Tops the agents up to `total`, online for an hour, 8 GPUs each."""
    database = Database(url)
    with database.write() as session:
        have = session.query(Agent).count()
        until = utcnow() + timedelta(hours=1)
        for i in range(have, total):
            gpus = [
                {"kind": "gpu", "index": d, "name": "H100", "uuid": f"GPU-{i}-{d}", "memory_mib": 81559}
                for d in range(8)
            ]
            session.add(
                Agent(
                    name=f"scrape-agent-{i}",
                    hostname=f"gpu{i}",
                    advertise_address="127.0.0.1",
                    port_low=20000,
                    port_high=20100,
                    devices=gpus,
                    online_until=until,
                )
            )
    database.dispose()


def time_counts(url: str, runs: int) -> dict[str, float]:
    database = Database(url)
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        with database.read() as session:
            counts = count_cluster(session)
        samples.append((time.perf_counter() - began) * 1000)
    database.dispose()
    print(
        f"  counts: jobs {counts.jobs_by_state}, agents {counts.agents_by_liveness}, devices {counts.devices_by_kind}"
    )
    samples.sort()
    return {"p50_ms": round(statistics.median(samples), 2), "max_ms": round(samples[-1], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(root=Path(tmp), http_port=free_port(), grpc_port=free_port())
        (cluster.root / "data").mkdir()
        url = f"sqlite:///{cluster.root / 'data' / 'mwms.db'}"
        began = time.monotonic()
        seeded = seed(url, args.jobs)
        add_agents(url, args.agents)
        print(f"seeded {seeded} and {args.agents} agents in {time.monotonic() - began:.1f} s", flush=True)
        results = {"count_cluster (4 queries)": time_counts(url, args.requests)}
        try:
            cluster.start_server()
            http = cluster.http
            results["GET /metrics"] = timed(lambda: http.get("/metrics"), args.requests, warmup=3)
            # For scale on a shared machine: an authenticated endpoint that reads one small row.
            results["GET /api/v1/whoami (reference)"] = timed(
                lambda: http.get("/api/v1/whoami"), args.requests
            )
            page = http.get("/metrics").text
        finally:
            cluster.stop()
    reported = [
        line for line in page.splitlines() if line.startswith("mwms_cluster_scrape_duration_seconds ")
    ]
    results["page"] = {
        "bytes": len(page),
        "mwms_series": sum(1 for x in page.splitlines() if x.startswith("mwms_")),
    }
    print(json.dumps(results, indent=2))
    print(reported[0] if reported else "no mwms_cluster_scrape_duration_seconds on the page")
    ok = results["GET /metrics"]["p99_ms"] < TARGET_SCRAPE_P99_MS
    print(
        f"GET /metrics p99 {results['GET /metrics']['p99_ms']} ms; target < {TARGET_SCRAPE_P99_MS:.0f} ms: {'ok' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
