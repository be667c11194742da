"""What confining a task costs: its cgroup and port rules, its start, and a whole job against a hand launch.

Figures, each beside its target (issue 30):
- setup: making a task's cgroup with its limits, attaching its port rules (four cgroup BPF programs) and
  removing it again, per task (target: <= 50 ms, median);
- start: running /bin/true as a task is launched now (cgroup join shim, bubblewrap, setpriv, Landlock
  scope) against bubblewrap and setpriv alone, the sandbox before this confinement (target: <= 50 ms more);
- job: a small 2-worker MultiWorkerMirroredStrategy job through a local coordinator and two root agents,
  submit -> SUCCEEDED, against the same program started by hand with TF_CONFIG (target: <= 1.3x, the median
  of alternated runs).
Needs root (cgroups, BPF, task uids), bubblewrap and TensorFlow in the venv. Results: bench/results_confinement.json.
Usage: python bench/confinement.py [--runs 3] [--skip-job]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from mwms.worker_agent import cgroups, landlock  # noqa: E402
from mwms.worker_agent.port_guard import PortGuard  # noqa: E402
from mwms_testkit.cluster import Cluster, free_port  # noqa: E402

SETUP_TARGET_MS = 50.0
START_TARGET_MS = 50.0
JOB_TARGET_RATIO = 1.3
TASK_UID = 61990
PROGRAM = """
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
value = strategy.run(lambda: tf.constant(1.0))
print("REDUCED", float(strategy.reduce("SUM", value, axis=None)), flush=True)
"""


def setup_ms(rounds: int) -> list[float]:
    """Per round: make a task cgroup with limits, attach port rules, remove it."""
    work = Path(tempfile.mkdtemp(prefix="mwms-bench-"))
    tree, why = cgroups.detect(work)
    if tree is None:
        raise SystemExit(f"no task cgroups here: {why}")
    guard = PortGuard((29000, 29099), [50051])
    tf_config = json.dumps({"cluster": {"worker": ["127.0.0.1:29000", "127.0.0.1:29001"]}})
    took = []
    for index in range(rounds):
        began = time.perf_counter()
        cgroup = tree.create(f"bench-{index}", cgroups.TaskLimits(memory_bytes=2**30, pids_max=4096))
        if cgroup.bpf_dir is not None:
            guard.attach(cgroup.bpf_dir, guard.rules(29000, [(29000, 29099)], tf_config))
        cgroup.remove()
        took.append((time.perf_counter() - began) * 1000)
    shutil.rmtree(work, ignore_errors=True)
    return took


def start_ms(rounds: int) -> tuple[list[float], list[float]]:
    """Per round: /bin/true launched as a task is now, and in the sandbox alone."""
    bwrap, setpriv = shutil.which("bwrap"), shutil.which("setpriv")
    if bwrap is None or setpriv is None:
        raise SystemExit("bubblewrap and setpriv are needed")
    sandbox = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--"]
    drop = [setpriv, f"--reuid={TASK_UID}", f"--regid={TASK_UID}", "--clear-groups", "--"]
    work = Path(tempfile.mkdtemp(prefix="mwms-bench-"))
    tree, _ = cgroups.detect(work)
    assert tree is not None
    scope = landlock.shim_argv() if not landlock.unavailable() else []
    confined, plain = [], []
    for index in range(rounds):
        cgroup = tree.create(f"start-{index}", cgroups.TaskLimits(memory_bytes=2**30, pids_max=4096))
        for argv, into in (
            ([*cgroup.join_argv(), *sandbox, *drop, *scope, "/bin/true"], confined),
            ([*sandbox, *drop, "/bin/true"], plain),
        ):
            began = time.perf_counter()
            subprocess.run(argv, check=True)
            into.append((time.perf_counter() - began) * 1000)
        cgroup.remove()
    shutil.rmtree(work, ignore_errors=True)
    return confined, plain


def by_hand_s(directory: Path) -> float:
    """The job's two workers started at once with TF_CONFIG, until both exit."""
    ports = [free_port(), free_port()]
    cluster = [f"127.0.0.1:{port}" for port in ports]
    began = time.perf_counter()
    workers = []
    for index in range(2):
        config = {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(config), "TF_CPP_MIN_LOG_LEVEL": "2"}
        workers.append(
            subprocess.Popen(
                [sys.executable, "train.py"],
                cwd=directory,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    codes = [worker.wait() for worker in workers]
    assert codes == [0, 0], codes
    return time.perf_counter() - began


def through_mwms_s(cluster: Cluster) -> float:
    began = time.perf_counter()
    job_id = cluster.submit({"train.py": PROGRAM}, ["python", "train.py"], workers=2)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=300)
    assert job["state"] == "SUCCEEDED", job["reason"]
    return time.perf_counter() - began


def job_ratio(runs: int) -> tuple[list[float], list[float]]:
    root = Path(tempfile.mkdtemp(prefix="mwms-bench-job-"))
    program = root / "program"
    program.mkdir()
    (program / "train.py").write_text(PROGRAM)
    (root / "cluster").mkdir()
    cluster = Cluster(root=root / "cluster")
    hand, mwms = [], []
    try:
        cluster.start_server()
        cluster.start_agent("bench-1", 29100)
        cluster.start_agent("bench-2", 29200)
        through_mwms_s(cluster)  # warm the caches (bundle, page cache of TensorFlow)
        for _ in range(runs):
            hand.append(by_hand_s(program))
            mwms.append(through_mwms_s(cluster))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return hand, mwms


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="alternated job runs each way (default 3)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds of the setup and start figures")
    parser.add_argument("--skip-job", action="store_true", help="only the setup and start figures")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("SKIP bench/confinement.py: needs root (task cgroups, BPF, task uids)")
        return 0
    results: dict[str, float] = {}
    ok = True
    setup = statistics.median(setup_ms(args.rounds))
    results["setup_ms"] = setup
    print(f"task cgroup + port rules + removal: {setup:.1f} ms median (target <= {SETUP_TARGET_MS:g} ms)")
    ok &= setup <= SETUP_TARGET_MS
    confined, plain = start_ms(args.rounds)
    added = statistics.median(confined) - statistics.median(plain)
    results.update(start_confined_ms=statistics.median(confined), start_sandbox_ms=statistics.median(plain))
    results["start_added_ms"] = added
    print(
        f"task start: {statistics.median(confined):.1f} ms confined vs {statistics.median(plain):.1f} ms "
        f"sandbox alone: +{added:.1f} ms (target <= {START_TARGET_MS:g} ms)"
    )
    ok &= added <= START_TARGET_MS
    if not args.skip_job:
        hand, mwms = job_ratio(args.runs)
        ratio = statistics.median(mwms) / statistics.median(hand)
        results.update(
            job_by_hand_s=statistics.median(hand), job_mwms_s=statistics.median(mwms), job_ratio=ratio
        )
        print(
            f"2-worker job: {statistics.median(mwms):.2f} s through mwms vs {statistics.median(hand):.2f} s by "
            f"hand: {ratio:.2f}x (target <= {JOB_TARGET_RATIO:g}x)"
        )
        ok &= ratio <= JOB_TARGET_RATIO
    (ROOT / "bench" / "results_confinement.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
