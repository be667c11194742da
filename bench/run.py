"""Benchmarks of the control plane on a real local cluster (coordinator + two agents on loopback).

Measures, each over several runs:
  - job turnaround: submit -> SUCCEEDED for a trivial 2-worker job (scheduling + start + exit + report);
  - log throughput: a 2-worker job printing N lines per task, until every line is stored and readable;
  - metric throughput: a job appending N metric points, until all are readable through the API;
  - coordinator memory (RSS) after the runs.
Targets live here, not in unit tests. Usage: python bench/run.py [--runs 5] [--lines 50000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from cluster import Cluster, free_port, wait_until  # noqa: E402

# (metric, target, True when higher is better)
TARGETS = [
    ("turnaround_p50_s", 3.0, False),
    ("log_lines_per_s", 3000, True),
    ("metric_points_per_s", 2000, True),
]


def turnaround(cluster: Cluster, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.monotonic()
        job_id = cluster.submit({"p.py": "print('hi')\n"}, ["python", "p.py"], workers=2)
        cluster.wait_for(job_id, {"SUCCEEDED"}, timeout=60)
        times.append(time.monotonic() - start)
    return times


def log_throughput(cluster: Cluster, lines: int) -> float:
    program = f"for i in range({lines}):\n    print('line', i)\n"
    start = time.monotonic()
    job_id = cluster.submit({"p.py": program}, ["python", "p.py"], workers=2)
    cluster.wait_for(job_id, {"SUCCEEDED"}, timeout=600)

    wait_until(lambda: all(_last_seq(cluster, job_id, t) >= lines for t in (0, 1)), 600, "all log lines")
    return 2 * lines / (time.monotonic() - start)


def _last_seq(cluster: Cluster, job_id: str, task: int) -> int:
    page = cluster.http.get(f"/api/v1/jobs/{job_id}/logs", params={"tail": 1, "task": task}).json()["lines"]
    return page[-1]["seq"] if page else 0


def metric_throughput(cluster: Cluster, points: int) -> float:
    program = (
        "import json, os, time\n"
        "with open(os.environ['MWMS_METRICS_FILE'], 'a') as f:\n"
        f"    for i in range({points}):\n"
        "        f.write(json.dumps({'name': 'loss', 'step': i, 'value': 1.0 / (i + 1), 'time': time.time()}) + '\\n')\n"
    )
    start = time.monotonic()
    job_id = cluster.submit({"p.py": program}, ["python", "p.py"], workers=1)
    cluster.wait_for(job_id, {"SUCCEEDED"}, timeout=600)
    wait_until(lambda: len(cluster.metrics(job_id)) >= points, 600, "all metric points")
    return points / (time.monotonic() - start)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--points", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(root=Path(tmp), http_port=free_port(), grpc_port=free_port())
        try:
            cluster.start_server()
            cluster.start_agent("bench-1", 22000)
            cluster.start_agent("bench-2", 22100)
            times = turnaround(cluster, args.runs)
            results = {
                "turnaround_p50_s": statistics.median(times),
                "turnaround_max_s": max(times),
                "log_lines_per_s": log_throughput(cluster, args.lines),
                "metric_points_per_s": metric_throughput(cluster, args.points),
                "coordinator_rss_mib": rss_mib(cluster.server.popen.pid) if cluster.server else 0.0,
            }
        finally:
            cluster.stop()
    print(json.dumps(results, indent=2))
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    failed = [(k, t) for k, t, higher in TARGETS if (results[k] < t if higher else results[k] > t)]
    for key, target in failed:
        print(f"MISSED TARGET {key}: {results[key]:.2f} vs {target}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
