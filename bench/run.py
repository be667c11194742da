"""Benchmarks of the control plane: every scenario, each figure printed beside its target.

Scenarios (--scenario, repeatable; default: all):
  turnaround  a real local cluster (coordinator + two real agents on loopback), each over several runs:
  - job turnaround: submit -> SUCCEEDED for a trivial 2-worker job (scheduling + start + exit + report);
  - log throughput: a 2-worker job printing N lines per task, until every line is stored and readable;
  - metric throughput: a job appending N metric points, until all are readable through the API;
  - coordinator memory (RSS) after the runs.
  jobs        the endpoints the dashboard polls with 100,000 finished jobs stored (bench/jobs_at_volume.py)
  agents, gangs, ingest  issue 10's scale scenarios with simulated agents speaking the real protocol
              (bench/scale.py, testkit/mwms_testkit/simulator.py), each against a fresh coordinator; ingest runs three
              cases (--ingest-case: metrics alone, logs alone, both together), recorded as ingest_<case>.
Every scenario runs against SQLite (--db sqlite, the default) or against a fresh database in a throwaway
PostgreSQL server this script starts and removes (--db postgres; bench/databases.py).
Targets live here, not in unit tests. Results go to bench/results.json (bench/results_postgres.json with
--db postgres); exit status 1 when one is missed.
Usage: python bench/run.py [--db postgres] [--scenario agents --agents 1000 --seconds 30] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


import jobs_at_volume  # noqa: E402
import scale  # noqa: E402
from databases import CHOICES, BenchDatabase, bench_database  # noqa: E402
from machine_speed import machine_speed, speed_line  # noqa: E402

from mwms_testkit.cluster import Cluster, free_port, wait_until  # noqa: E402

SCENARIOS = ("turnaround", "agents", "gangs", "ingest", "jobs")
# (scenario, figure, target, "<" or ">=" or "=="): the figure meets the target when `figure op target`.
TARGETS = [
    ("turnaround", "turnaround_p50_s", 3.0, "<="),
    ("turnaround", "log_lines_per_s", 3000, ">="),
    ("turnaround", "metric_points_per_s", 2000, ">="),
    ("agents", "heartbeat_rtt_p99_ms", 50, "<"),
    ("agents", "coordinator_cpu_pct", 50, "<"),
    ("agents", "agents_lost", 0, "=="),
    ("agents", "agents_offline_max_in_window", 0, "=="),
    ("agents", "register_all_s", 10, "<"),
    ("gangs", "gang64_running_s", 2, "<="),
    ("gangs", "gang256_running_s", 5, "<="),
    ("gangs", "agents_lost", 0, "=="),
    # The ingest scenario's cases (bench/scale.py's INGEST_CASES), each its own entry in the results.
    *(
        (f"ingest_{case}", key, target, ">=")
        for case, rates in scale.INGEST_CASES.items()
        for key, target in rates.items()
        if target
    ),
    *(
        (f"ingest_{case}", key, target, op)
        for case, rates in scale.INGEST_CASES.items()
        for key, target, op in (
            ("points_stored_once", True, "=="),
            ("lines_stored_once", True, "=="),
            ("heartbeat_rtt_p99_ms", 50, "<"),
            ("agents_lost", 0, "=="),
            ("agents_offline_max_in_window", 0, "=="),
            ("tasks_stopped", 0, "=="),
        )
        if not (key == "points_stored_once" and not rates["metric_points_per_s"])
        and not (key == "lines_stored_once" and not rates["log_lines_per_s"])
    ),
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
    wait_until(lambda: _stored_points(cluster, job_id) >= points, 600, "all metric points")
    return points / (time.monotonic() - start)


def _stored_points(cluster: Cluster, job_id: str) -> int:
    """The job's metric points readable through the API, every page (a page holds at most 10,000)."""
    count, after = 0, 0
    while True:
        page = cluster.http.get(f"/api/v1/jobs/{job_id}/metrics", params={"after": after}).json()
        count += len(page["points"])
        if not page["more"] or not page["points"]:
            return count
        after = page["cursor"]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_turnaround(args: argparse.Namespace, database: BenchDatabase) -> dict[str, object]:
    url = database.fresh("turnaround")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(
            root=Path(tmp), http_port=free_port(), grpc_port=free_port(), server_env=database.server_env(url)
        )
        try:
            cluster.start_server()
            cluster.start_agent("bench-1", 22000)
            cluster.start_agent("bench-2", 22100)
            times = turnaround(cluster, args.runs)
            return {
                "turnaround_p50_s": statistics.median(times),
                "turnaround_max_s": max(times),
                "log_lines_per_s": log_throughput(cluster, args.lines),
                "metric_points_per_s": metric_throughput(cluster, args.points),
                "coordinator_rss_mib": rss_mib(cluster.server.popen.pid) if cluster.server else 0.0,
                "database_top_statements": database.top_statements(url),
            }
        finally:
            cluster.stop()


def ingest_rates(case: str, args: argparse.Namespace) -> dict[str, float | None]:
    """The rates an ingest case offers: its targets times the headroom, or None (as fast as acks allow)
    for each kind it streams."""
    targets = scale.INGEST_CASES[case]
    if args.ingest_rate == "unlimited":
        return {key: None if target else 0 for key, target in targets.items()}
    return {key: target * scale.INGEST_HEADROOM for key, target in targets.items()}


def run_scale(name: str, args: argparse.Namespace, database: BenchDatabase) -> dict[str, object]:
    """One scale scenario (an ingest case: "ingest_<case>") against a fresh coordinator and database,
    with this process as the simulator.

    A scenario that breaks returns what it measured until then, with the error.
    """
    results: dict[str, object] = {}
    url = database.fresh(name)
    pid = database.pid
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(
            root=Path(tmp), http_port=free_port(), grpc_port=free_port(), server_env=database.server_env(url)
        )
        try:
            cluster.start_server()
            assert cluster.server is not None
            if name == "agents":
                coroutine = scale.scenario_agents(
                    cluster, results, args.agents, args.seconds, database_pid=pid
                )
            elif name == "gangs":
                sizes = tuple(s for s in args.gang if s <= args.agents)
                coroutine = scale.scenario_gangs(cluster, results, args.agents, sizes, database_pid=pid)
            else:
                rates = ingest_rates(name.removeprefix("ingest_"), args)
                coroutine = scale.scenario_ingest(
                    cluster, results, args.agents, args.tasks, args.seconds, database_pid=pid, **rates
                )
            asyncio.run(coroutine)
            results["coordinator_rss_mib"] = rss_mib(cluster.server.popen.pid)
            results["database_top_statements"] = database.top_statements(url)
            return results
        except Exception as error:  # noqa: BLE001 - a scenario that breaks is a result too
            tail = cluster.server.log_tail(40) if cluster.server else ""
            print(f"scenario {name} failed: {type(error).__name__}: {error}\n{tail}", file=sys.stderr)
            return results | {
                "error": f"{type(error).__name__}: {error}",
                "coordinator_log_tail": tail[-4000:],
            }
        finally:
            cluster.stop()
            keep_log(cluster, args, name)


def keep_log(cluster: Cluster, args: argparse.Namespace, scenario: str) -> None:
    """Copies the coordinator's log to --logs DIR (the scenario's temp dir is removed afterwards)."""
    if args.logs and cluster.server is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cluster.server.log_path, args.logs / f"{scenario}-{args.db}-coordinator.log")


def meets(value: object, target: object, op: str) -> bool:
    if value is None or isinstance(value, str):
        return False
    if op == "==":
        return value == target
    if op == "<":
        return value < target  # type: ignore[operator]
    if op == "<=":
        return value <= target  # type: ignore[operator]
    return value >= target  # type: ignore[operator]


def report(scenarios: dict[str, dict[str, object]]) -> list[str]:
    """Prints every figure that has a target beside it; returns the missed ones."""
    missed = []
    print(f"\n{'scenario':<15} {'figure':<28} {'measured':>14}  target")
    for name, key, target, op in TARGETS:
        if name not in scenarios:
            continue
        value = scenarios[name].get(key)
        ok = meets(value, target, op)
        shown = f"{value:,.2f}" if isinstance(value, float) else str(value)
        offered = scenarios[name].get(f"offered_{key}", "")  # an ingest case's offered rate
        beside = f"  (offered {offered:,.0f})" if isinstance(offered, (int, float)) else ""
        print(f"{name:<15} {key:<28} {shown:>14}  {op} {target}  {'ok' if ok else 'MISSED'}{beside}")
        if not ok:
            missed.append(f"{name}.{key}: {shown} (target {op} {target})")
    return missed


def machine() -> str:
    return (
        f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}"
    )


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out.stdout.strip()[:80] + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def earlier_scenarios(path: Path) -> dict[str, dict[str, object]]:
    """Scenarios of an earlier results file, kept when this run does not repeat them (each has its stamp)."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    scenarios = earlier.get("scenarios") if isinstance(earlier, dict) else None
    if not isinstance(scenarios, dict):
        return {}
    stamp = {k: earlier.get(k) for k in ("run_at", "commit", "machine", "arguments")}
    return {name: {**stamp, **figures} for name, figures in scenarios.items() if isinstance(figures, dict)}


def write_results(
    path: Path, stamp: dict[str, str], scenarios: dict[str, dict[str, object]], missed: list[str] | None
) -> None:
    """This run's scenarios over the earlier file's; `missed` None while the run is still going."""
    results = {**stamp, "scenarios": earlier_scenarios(path) | scenarios, "missed_this_run": missed}
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # As SystemExit, so the coordinators and a PostgreSQL server are stopped on the way out, as on Ctrl-C.
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable; default: all")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--points", type=int, default=20_000)
    parser.add_argument("--agents", type=int, default=1000, help="simulated agents (agents, gangs, ingest)")
    parser.add_argument("--seconds", type=float, default=30, help="measurement window (agents, ingest)")
    parser.add_argument("--gang", type=int, action="append", help="gang sizes (default 64 and 256)")
    parser.add_argument("--tasks", type=int, default=50, help="streaming tasks (ingest)")
    parser.add_argument(
        "--ingest-case",
        action="append",
        choices=tuple(scale.INGEST_CASES),
        help="ingest cases to run (repeatable; default: all): metrics alone, logs alone, both together",
    )
    parser.add_argument(
        "--ingest-rate",
        choices=("target", "unlimited"),
        default="target",
        help=f"offer each case's targets x {scale.INGEST_HEADROOM} (default), or as fast as acks allow",
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="finished jobs stored (jobs)")
    parser.add_argument("--requests", type=int, default=200, help="requests per endpoint (jobs)")
    parser.add_argument("--db", choices=CHOICES, default="sqlite", help="the coordinators' database")
    parser.add_argument("--out", type=Path, help="default: bench/results.json, results_postgres.json")
    parser.add_argument("--logs", type=Path, help="keep each scale scenario's coordinator log in this folder")
    args = parser.parse_args()
    if args.out is None:
        args.out = ROOT / "bench" / ("results.json" if args.db == "sqlite" else f"results_{args.db}.json")
    args.gang = args.gang or [64, 256]
    chosen = args.scenario or list(SCENARIOS)
    # Taken at the start: the tree measured is the one the coordinators started from.
    stamp = {
        "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit(),
        "machine": machine(),
        "arguments": " ".join(sys.argv[1:]),
        "database": args.db,
    }
    scenarios: dict[str, dict[str, object]] = {}
    runs = [
        part
        for name in SCENARIOS
        if name in chosen
        for part in (
            [f"ingest_{case}" for case in args.ingest_case or scale.INGEST_CASES]
            if name == "ingest"
            else [name]
        )
    ]
    with bench_database(args.db) as database:
        for name in runs:
            speed = machine_speed()
            started = time.monotonic()
            load_before = os.getloadavg()
            print(f"--- {name} ({args.db}; {speed_line(speed)})", file=sys.stderr, flush=True)
            if name == "turnaround":
                scenarios[name] = run_turnaround(args, database)
            elif name == "jobs":  # bench/jobs_at_volume.py prints and judges its own endpoints' targets
                scenarios[name] = jobs_at_volume.run_scenario(args.jobs, args.requests, database)
            else:
                scenarios[name] = run_scale(name, args, database)
            scenarios[name]["scenario_wall_s"] = time.monotonic() - started
            # The 1-minute load average (as `uptime` shows it) before and after: how shared the machine was.
            scenarios[name]["load_average_before"] = load_before
            scenarios[name]["load_average_after"] = os.getloadavg()
            scenarios[name]["machine_speed_before"] = speed
            scenarios[name].update(stamp)
            print(json.dumps({name: scenarios[name]}, indent=2, default=str), flush=True)
            # Written after each scenario, so an interrupted run keeps what it measured.
            write_results(args.out, stamp, scenarios, missed=None)
    missed = report(scenarios) + [f"jobs.{m}" for m in scenarios.get("jobs", {}).get("missed", [])]  # type: ignore[union-attr]
    write_results(args.out, stamp, scenarios, missed)
    for line in missed:
        print(f"MISSED TARGET {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
