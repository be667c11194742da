"""What warm starts (worker_agent/warm_pool.py, `mwms agent --warm-pool`) buy: jobs against the same programs
started by hand with TF_CONFIG.

Figures, each beside its target (issue 34):
- seed job: a small 2-worker MultiWorkerMirroredStrategy job through a local coordinator and two root agents
  with warm interpreters ready, submit -> SUCCEEDED, against its two workers started by hand (target: <= 0.8x,
  the median of alternated runs);
- first line: submit -> every worker of that job running its program's first line (its own clock), on warm
  agents (target: <= 0.5 s, median);
- sweep: 20 single-worker small jobs submitted at once to the two agents, first submit -> last SUCCEEDED,
  against the same 20 programs by hand, two at a time (reported beside each other, and their ratio).
The agents advertise 127.0.0.1 and 127.0.0.2, so a job's two workers are not co-located by TF_CONFIG
(co-located workers start cold). Needs root (task uids, cgroups), bubblewrap and TensorFlow in the venv.
Results: bench/results_warm_starts.json.
Usage: python bench/warm_starts.py [--runs 3] [--sweep 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from mwms_testkit.cluster import Cluster, free_port, wait_until  # noqa: E402

SEED_TARGET_RATIO = 0.8
FIRST_LINE_TARGET_S = 0.5
# The first line is the program's own, before anything is imported: its time is when the program began.
PROGRAM = """
import time
print("FIRST_LINE", repr(time.time()), flush=True)
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
    model.compile(optimizer="sgd", loss="mse")
model.fit(tf.ones((64, 4)), tf.zeros((64, 1)), batch_size=16, epochs=1, verbose=0)
print("DONE", flush=True)
"""
AGENTS = (("warm-bench-1", "127.0.0.1", 29300), ("warm-bench-2", "127.0.0.2", 29400))


def by_hand_s(directory: Path, workers: int) -> float:
    """One job's workers started at once with TF_CONFIG, until all exit."""
    cluster = [f"127.0.0.1:{free_port()}" for _ in range(workers)]
    began = time.perf_counter()
    processes = []
    for index in range(workers):
        config = {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(config), "TF_USE_LEGACY_KERAS": "1"}
        processes.append(
            subprocess.Popen(
                [sys.executable, "train.py"],
                cwd=directory,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    codes = [process.wait() for process in processes]
    assert codes == [0] * workers, codes
    return time.perf_counter() - began


def sweep_by_hand_s(directory: Path, jobs: int) -> float:
    """`jobs` single-worker runs, two at a time (the two agents' slots)."""
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda _: by_hand_s(directory, 1), range(jobs)))
    return time.perf_counter() - began


def pools_ready(cluster: Cluster) -> None:
    """Until both agents have a warm interpreter ready (as the agent list says)."""

    def ready() -> bool:
        agents = cluster.http.get("/api/v1/agents").json()
        return all((a.get("warm_pool") or {}).get("ready", 0) >= 1 for a in agents if a["online"])

    wait_until(ready, 180, "warm interpreters ready on both agents", interval=0.5)
    time.sleep(6)  # the pool's figures reach the coordinator with heartbeats; let a late one settle


def through_mwms(cluster: Cluster, bundle: bytes, workers: int) -> tuple[float, float, str, str]:
    """(submit -> SUCCEEDED s, submit -> last worker's first line s, job id, its log)."""
    submitted = time.time()
    began = time.perf_counter()
    job_id = cluster.submit(bundle, ["python", "train.py"], workers=workers)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=300)
    took = time.perf_counter() - began
    text = cluster.logs_text(job_id)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + text
    firsts = [float(t) for t in re.findall(r"FIRST_LINE (\S+)", text)]
    assert len(firsts) == workers, text
    return took, max(firsts) - submitted, job_id, text


def sweep_through_mwms_s(cluster: Cluster, bundle: bytes, jobs: int) -> tuple[float, int]:
    """(first submit -> last SUCCEEDED s, how many of the jobs started warm)."""
    began = time.perf_counter()
    ids = [cluster.submit(bundle, ["python", "train.py"], workers=1) for _ in range(jobs)]
    for job_id in ids:
        job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=900)
        assert job["state"] == "SUCCEEDED", job["reason"]
    took = time.perf_counter() - began
    warm = sum("mwms-agent: warm start" in cluster.logs_text(job_id) for job_id in ids)
    return took, warm


def run(runs: int, jobs: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="mwms-bench-warm-"))
    program = root / "program"
    program.mkdir()
    (program / "train.py").write_text(PROGRAM)
    (root / "cluster").mkdir()
    cluster = Cluster(root=root / "cluster")
    hand, mwms, firsts, warm_jobs = [], [], [], 0
    try:
        cluster.start_server()
        for name, address, ports in AGENTS:
            cluster.start_agent(name, ports, extra_args=["--advertise-address", address, "--warm-pool", "1"])
        from mwms_testkit.cluster import pack

        bundle = pack({"train.py": PROGRAM})
        by_hand_s(program, 2)  # warm the page cache of TensorFlow
        pools_ready(cluster)
        through_mwms(cluster, bundle, 2)  # and the agents' bundle caches
        for _ in range(runs):
            hand.append(by_hand_s(program, 2))
            pools_ready(cluster)
            took, first, _, text = through_mwms(cluster, bundle, 2)
            warm_jobs += text.count("mwms-agent: warm start") == 2
            mwms.append(took)
            firsts.append(first)
        sweep_hand = sweep_by_hand_s(program, jobs)
        pools_ready(cluster)
        sweep_mwms, sweep_warm = sweep_through_mwms_s(cluster, bundle, jobs)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "seed_by_hand_s": statistics.median(hand),
        "seed_mwms_s": statistics.median(mwms),
        "seed_ratio": statistics.median(mwms) / statistics.median(hand),
        "seed_runs_all_warm": warm_jobs,
        "seed_runs": runs,
        "first_line_s": statistics.median(firsts),
        "sweep_jobs": jobs,
        "sweep_by_hand_s": sweep_hand,
        "sweep_mwms_s": sweep_mwms,
        "sweep_ratio": sweep_mwms / sweep_hand,
        "sweep_warm_starts": sweep_warm,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="alternated seed job runs each way (default 3)")
    parser.add_argument("--sweep", type=int, default=20, help="jobs in the sweep (default 20)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("SKIP bench/warm_starts.py: needs root (task uids, cgroups)")
        return 0
    results = run(args.runs, args.sweep)
    ok = results["seed_ratio"] <= SEED_TARGET_RATIO and results["first_line_s"] <= FIRST_LINE_TARGET_S
    print(
        f"seed 2-worker job: {results['seed_mwms_s']:.2f} s through mwms vs {results['seed_by_hand_s']:.2f} s by "
        f"hand: {results['seed_ratio']:.2f}x (target <= {SEED_TARGET_RATIO:g}x); "
        f"{results['seed_runs_all_warm']}/{results['seed_runs']} runs with both workers warm"
    )
    print(
        f"submit -> every worker running its first line: {results['first_line_s']:.2f} s median "
        f"(target <= {FIRST_LINE_TARGET_S:g} s)"
    )
    print(
        f"sweep of {args.sweep} small jobs: {results['sweep_mwms_s']:.1f} s through mwms vs "
        f"{results['sweep_by_hand_s']:.1f} s by hand, two at a time: {results['sweep_ratio']:.2f}x "
        f"({results['sweep_warm_starts']} warm starts)"
    )
    (ROOT / "bench" / "results_warm_starts.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
