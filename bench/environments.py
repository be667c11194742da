"""A job's own Python environment (issue 22): what a build costs, and what a start costs once it is cached.

Against a real coordinator and two real agents on loopback (testkit/mwms_testkit/cluster.py), sharing one environment
cache as agents on one machine would (--env-cache-dir), with uv's own cache in a fresh directory so the
first build downloads as a new machine would:
  baseline       submit -> RUNNING of a 2-worker job in the agents' environment (median of --runs)
  cold           the same job with --requirements (numpy, tabulate): resolve at submit, download, build
  cache hit      the same requirements again: submit -> RUNNING, nothing installed (median of --runs);
                 apart, the resolve at submit alone (uv's cache warm)
  warm uv        another lock of the same packages plus one small one: a build from uv's cache
Each start is measured from before the resolve to the coordinator's RUNNING; the build seconds the agents
reported are recorded beside it. Targets live here; results go to bench/results_environments.json; exit
status 1 when one is missed.
Usage: python bench/environments.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import run as bench_run  # noqa: E402

from mwms.client import Client  # noqa: E402
from mwms.client.environment import resolve  # noqa: E402
from mwms_testkit.cluster import Cluster, free_port, wait_until  # noqa: E402

PROGRAM = "import time\ntime.sleep(0.5)\n"
REQUIREMENTS = "numpy>=2,<3\ntabulate==0.9.0\n"
WARM_REQUIREMENTS = REQUIREMENTS + "six==1.17.0\n"
# (figure, target, op): a cached environment adds at most a second to a start, the resolve at submit
# included; a first build of numpy and tabulate (downloads included) takes under a minute; one from uv's
# cache under 15 s.
TARGETS = [
    ("cache_hit_extra_start_s", 1.0, "<="),
    ("cold_start_s", 60.0, "<="),
    ("warm_uv_start_s", 15.0, "<="),
    ("cache_hit_build_s", 0.0, "=="),
]


def timed_start(
    cluster: Cluster, client: Client, directory: Path, requirements: str | None
) -> dict[str, Any]:
    """Seconds from submit (the resolve included) to RUNNING, and what each task reported of its build."""
    started = time.monotonic()
    job = client.submit(directory, "python p.py", workers=2, requirements=requirements)
    wait_until(lambda: cluster.job(job.id)["state"] in {"RUNNING", "SUCCEEDED", "FAILED"}, 600, "RUNNING")
    running_s = time.monotonic() - started
    ended = cluster.wait_for(job.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert ended["state"] == "SUCCEEDED", ended["reason"]
    builds = [task["environment_build_seconds"] for task in ended["tasks"]]
    return {"start_s": running_s, "build_s": builds}


def program(root: Path, name: str, requirements: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "p.py").write_text(PROGRAM)
    (directory / "requirements.txt").write_text(requirements)
    return directory


class FreshUvCluster(Cluster):
    """Agents with uv's cache in a fresh directory (the submit's resolve uses it too: see measure)."""

    def agent_environment(self) -> dict[str, str]:
        return {**super().agent_environment(), "UV_CACHE_DIR": os.environ["UV_CACHE_DIR"]}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["UV_CACHE_DIR"] = str(root / "uv")  # the first resolve and build download
        (root / "cluster").mkdir()
        cluster = FreshUvCluster(root=root / "cluster", http_port=free_port(), grpc_port=free_port())
        try:
            cluster.start_server()
            cluster.start_agent("env-1", 23000)
            cluster.start_agent("env-2", 23100)
            with Client(cluster.api, token=cluster.admin_token) as client:
                plain = program(root, "plain", "")
                cached = program(root, "cached", REQUIREMENTS)
                warm = program(root, "warm", WARM_REQUIREMENTS)
                baseline = [timed_start(cluster, client, plain, None)["start_s"] for _ in range(args.runs)]
                cold = timed_start(cluster, client, cached, "requirements.txt")
                hits = [timed_start(cluster, client, cached, "requirements.txt") for _ in range(args.runs)]
                warm_uv = timed_start(cluster, client, warm, "requirements.txt")
                resolves = []
                for _ in range(args.runs):
                    started = time.monotonic()
                    resolve(cached, "requirements.txt")
                    resolves.append(time.monotonic() - started)
        finally:
            cluster.stop()
    hit_s = statistics.median(h["start_s"] for h in hits)
    return {
        "baseline_start_s": statistics.median(baseline),
        "cold_start_s": cold["start_s"],
        "cold_build_s": max(b for b in cold["build_s"] if b is not None),
        "cache_hit_start_s": hit_s,
        "cache_hit_extra_start_s": hit_s - statistics.median(baseline),
        "cache_hit_build_s": max(max(h["build_s"]) for h in hits),
        "resolve_at_submit_s": statistics.median(resolves),
        "warm_uv_start_s": warm_uv["start_s"],
        "warm_uv_build_s": max(b for b in warm_uv["build_s"] if b is not None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="starts measured for the baseline and cache hits")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results_environments.json")
    args = parser.parse_args()
    figures = measure(args)
    missed = []
    print(f"\n{'figure':<26} {'measured':>10}  target")
    for key in figures:
        target = next(((t, op) for name, t, op in TARGETS if name == key), None)
        ok = target is None or bench_run.meets(figures[key], target[0], target[1])
        shown = f"{figures[key]:.2f}"
        print(
            f"{key:<26} {shown:>10}  {f'{target[1]} {target[0]}' if target else 'recorded'}{'' if ok else '  MISSED'}"
        )
        if not ok:
            missed.append(key)
    stamp = {
        "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": bench_run.commit(),
        "machine": bench_run.machine(),
        "arguments": " ".join(sys.argv[1:]),
    }
    args.out.write_text(json.dumps({**stamp, "figures": figures, "missed": missed}, indent=2) + "\n")
    print(f"results in {args.out.relative_to(ROOT)}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
