"""Start real TensorFlow worker processes on loopback with a hand-made TF_CONFIG, as the agent would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mwms import grpc_process
from mwms_testkit import REPO

PYTHON = sys.executable
EXAMPLES = REPO / "examples"


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports the OS reported free (all bound at once, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def task_env(
    root: Path, index: int, num_workers: int, ports: list[int] | None, **extra: str
) -> dict[str, str]:
    """Return the environment the agent gives task ``index``, with every path under ``root``."""
    ours = grpc_process.set_by_mwms(os.environ)  # as the agent: TensorFlow's gRPC would read them
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MWMS_") and k != "TF_CONFIG" and k not in ours
    }
    if num_workers > 1:
        assert ports is not None
        cluster = {"worker": [f"localhost:{p}" for p in ports]}
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
    env.update(
        CUDA_VISIBLE_DEVICES="",
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_USE_LEGACY_KERAS="1",
        MWMS_JOB_ID="test-job",
        MWMS_TASK_ID=f"test-job-{index}",
        MWMS_ATTEMPT="1",
        MWMS_TASK_INDEX=str(index),
        MWMS_NUM_WORKERS=str(num_workers),
        MWMS_OUTPUT_DIR=str(root / f"output-{index}"),
        MWMS_CHECKPOINT_DIR=str(root / "checkpoints"),
        MWMS_METRICS_FILE=str(root / f"metrics-{index}.jsonl"),
        MWMS_DEVICE_KIND="cpu",
        MWMS_NUM_GPUS="0",
        TMPDIR=str(root / f"tmp-{index}"),
    )
    (root / f"tmp-{index}").mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


@dataclass
class TaskResult:
    """Exit code and captured output of one finished task."""

    index: int
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        """Return everything a failing assertion should show about this task."""
        return (
            f"--- task {self.index} rc={self.returncode} after {self.seconds:.1f}s\n"
            f"stdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-4000:]}"
        )


class Gang:
    """The running tasks of one job, started by start_tasks()."""

    def __init__(self, root: Path, procs: list[tuple[subprocess.Popen, IO[str], IO[str]]]) -> None:
        self.root = root
        self.procs = procs
        self.started = time.monotonic()

    def stdout(self, index: int) -> str:
        """What task ``index`` has printed so far."""
        return (self.root / f"stdout-{index}.txt").read_text()

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to every task still running, as the agent does to preempt a gang."""
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def wait(self, timeout: float = 90.0, wait_for: list[int] | None = None) -> list[TaskResult]:
        """Wait for the ``wait_for`` tasks (default all) at most ``timeout`` s; kill the rest."""
        ended: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        awaited = set(range(len(self.procs)) if wait_for is None else wait_for)
        while not awaited <= set(ended) and time.monotonic() < deadline:
            for index, (proc, _, _) in enumerate(self.procs):
                if index not in ended and proc.poll() is not None:
                    ended[index] = time.monotonic() - self.started
            time.sleep(0.1)
        results = []
        for index, (proc, out, err) in enumerate(self.procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()
            results.append(
                TaskResult(
                    index=index,
                    returncode=proc.returncode if index in ended else None,
                    stdout=(self.root / f"stdout-{index}.txt").read_text(),
                    stderr=(self.root / f"stderr-{index}.txt").read_text(),
                    seconds=ended.get(index, time.monotonic() - self.started),
                )
            )
        return results


def start_tasks(argv: list[str], cwd: Path, root: Path, num_workers: int, **extra: str) -> Gang:
    """Start ``argv`` as every task of a job (output in ``root``) and return them running."""
    ports = free_ports(num_workers) if num_workers > 1 else None
    root.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    procs = []
    for index in range(num_workers):
        out = open(root / f"stdout-{index}.txt", "w")  # noqa: SIM115 - closed by Gang.wait
        err = open(root / f"stderr-{index}.txt", "w")  # noqa: SIM115
        env = task_env(root, index, num_workers, ports, **extra)
        procs.append((subprocess.Popen([PYTHON, *argv], cwd=cwd, env=env, stdout=out, stderr=err), out, err))
    return Gang(root, procs)


def run_tasks(
    argv: list[str],
    cwd: Path,
    root: Path,
    num_workers: int,
    timeout: float = 90.0,
    wait_for: list[int] | None = None,
    **extra: str,
) -> list[TaskResult]:
    """Run ``argv`` as every task of a job and wait for the ``wait_for`` tasks (default all); kill the rest."""
    return start_tasks(argv, cwd, root, num_workers, **extra).wait(timeout, wait_for)


def read_metrics(path: Path) -> list[dict]:
    """Return the metrics file's lines as dicts ([] when the file does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
