"""scripts/gpu_check.py, the one-shot check of a GPU machine, run end to end on a machine without one.

The script runs as an operator runs it (a process, as root), here with the stand-in GPUs of
testkit/mwms_testkit/fake_gpus.py: a fake `nvidia-smi` first on PATH, stand-in driver files and nodes (GPU 0 is
/dev/nvidia1), and the agent's sampler hook. Everything else is real: the coordinator and the sandboxed
root agent it starts, its probe jobs in bubblewrap as uids of their own, the REST API it reads. What the
stand-ins can prove passes (what each task is told, the nodes it sees, what `nvidia-smi -L` lists in it,
the job's device telemetry, co-located workers' /dev/shm); CUDA and the matmul throughput need a CUDA
driver, so they come out SKIP. Without a GPU, or not as root, the whole check is skipped (exit 2).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mwms_testkit import REPO
from mwms_testkit.fake_gpus import MINORS, UUIDS, write_fake_gpu_tools

REPO = REPO
SCRIPT = REPO / "scripts" / "gpu_check.py"
RUN_TIMEOUT_S = 300

pytestmark = pytest.mark.e2e

needs_root_and_bwrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None, reason="sandboxed tasks need root and bubblewrap"
)


def has_cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# The stand-ins' CUDA checks say SKIP for want of a CUDA driver; a real one would answer with real GPUs.
no_cuda_driver = pytest.mark.skipif(has_cuda_driver(), reason="a real CUDA driver would meet the stand-ins")

# A driver that does not answer, as nvidia-smi says it on a machine whose GPUs (or driver) are gone.
BROKEN_NVIDIA_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""


def reachable_by_everyone(directory: Path) -> bool:
    """Whether every user may enter `directory` and every directory above it."""
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in [directory, *directory.parents])


def sandbox_visible_root() -> Path:
    """A directory that a sandboxed task sees as it is: not under /tmp or /var/tmp (a task gets private
    ones) nor under a directory closed to other users (the sandbox masks those), where the stand-in
    `nvidia-smi` must be for a task's `nvidia-smi -L` to find it."""
    for candidate in (Path("/run"), REPO / "build"):
        candidate.mkdir(exist_ok=True)
        if os.access(candidate, os.W_OK) and reachable_by_everyone(candidate):
            return candidate
    pytest.skip("no directory a sandboxed task can see to hold the stand-in nvidia-smi")


@pytest.fixture
def stand_in_gpus() -> Iterator[dict[str, str]]:
    """The environment that shows the script (and the agent it starts) the two stand-in GPUs."""
    root = Path(tempfile.mkdtemp(prefix="mwms-gpu-check-test-", dir=sandbox_visible_root()))
    try:
        root.chmod(0o755)
        yield {**os.environ, **write_fake_gpu_tools(root / "tools", root / "samples.json")}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_script(
    env: dict[str, str], *args: str, user: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(user or []), sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=RUN_TIMEOUT_S + 60,
        check=False,
    )


def statuses(document: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["status"] for check in document["checks"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@needs_root_and_bwrap
@no_cuda_driver
def test_stand_in_gpus_pass_every_check_that_needs_no_cuda_driver(stand_in_gpus) -> None:
    done = run_script(stand_in_gpus, "--json", "--timeout", str(RUN_TIMEOUT_S), "--bench-seconds", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["result"] == "PASS" and document["exit_code"] == 0, done.stdout
    assert document["counts"] == {"PASS": 21, "FAIL": 0, "SKIP": 6}, done.stdout

    # What it found outside any sandbox: the GPUs, their minor numbers; no CUDA driver, so no figure.
    assert [(g["index"], g["uuid"], g["minor"], g["node"]) for g in document["gpus"]] == [
        (0, UUIDS[0], MINORS[0], f"/dev/nvidia{MINORS[0]}"),
        (1, UUIDS[1], MINORS[1], f"/dev/nvidia{MINORS[1]}"),
    ]
    assert all(g["tflops_outside"] is None for g in document["gpus"])

    found = statuses(document)
    passed = ["gpus", "sandbox", "agent.registered", "agent.confined"]
    for gpu in (0, 1):
        passed += [f"gpu{gpu}.{name}" for name in ("job", "env", "nodes", "nvidia_smi", "telemetry")]
    passed += [f"two_gpus.{name}" for name in ("job", "env", "nodes", "nvidia_smi")]
    passed += [f"colocated.{name}" for name in ("job", "gpus", "dev_shm")]
    skipped = [
        "cuda.outside",
        "gpu0.cuda",
        "gpu0.throughput",
        "gpu1.cuda",
        "gpu1.throughput",
        "two_gpus.cuda",
    ]
    assert {name: found.get(name) for name in passed} == dict.fromkeys(passed, "PASS"), done.stdout
    assert {name: found.get(name) for name in skipped} == dict.fromkeys(skipped, "SKIP"), done.stdout
    assert set(found) == set(passed + skipped)
    checks = {check["name"]: check for check in document["checks"]}
    for name in skipped:
        assert "no CUDA driver" in checks[name]["detail"], checks[name]

    # The figures behind the passes: each task was told its own GPU by UUID and saw only its node.
    assert UUIDS[0] in checks["gpu0.env"]["detail"] and f"nvidia{MINORS[0]}" in checks["gpu0.nodes"]["detail"]
    assert UUIDS[1] in checks["gpu1.env"]["detail"] and f"nvidia{MINORS[1]}" in checks["gpu1.nodes"]["detail"]
    assert "bwrap sandbox" in checks["agent.registered"]["detail"]
    telemetry = [checks[f"gpu{gpu}.telemetry"]["figures"] for gpu in (0, 1)]
    assert [(t["max_utilization_pct"], t["max_memory_used_mib"]) for t in telemetry] == [
        (10.0, 4096),
        (20.0, 2048),
    ]
    assert all(t["points"] >= 1 for t in telemetry)
    assert set(document["jobs"]) == {"gpu-0", "gpu-1", "two-gpus", "colocated"}

    # Everything it started has stopped, and what it made is gone (no --keep).
    assert not document["kept"] and not Path(document["work_dir"]).exists()
    assert set(document["pids"]) == {"coordinator", "agent"}
    assert not [name for name, pid in document["pids"].items() if alive(pid)]


@needs_root_and_bwrap
@no_cuda_driver
def test_the_table_says_each_result_and_keep_keeps_the_logs(stand_in_gpus) -> None:
    done = run_script(stand_in_gpus, "--keep", "--timeout", str(RUN_TIMEOUT_S), "--bench-seconds", "1")
    lines = done.stdout.splitlines()
    kept = [line.removeprefix("kept: ").split()[0] for line in lines if line.startswith("kept: ")]
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        rows = {
            line.split()[0]: line.split()[1] for line in lines if line.startswith(("gpu0.", "colocated."))
        }
        assert rows["gpu0.env"] == "PASS" and rows["gpu0.throughput"] == "SKIP", done.stdout
        assert rows["colocated.dev_shm"] == "PASS", done.stdout
        assert any(line.startswith("PASS: 21 passed, 0 failed, 6 skipped") for line in lines), done.stdout
        [work_dir] = kept
        assert (Path(work_dir) / "agent.log").is_file() and (Path(work_dir) / "server.log").is_file()
    finally:
        for directory in kept:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize(
    "nvidia_smi", [None, BROKEN_NVIDIA_SMI], ids=["no-nvidia-smi", "driver-not-answering"]
)
def test_without_a_gpu_the_check_is_skipped(tmp_path: Path, nvidia_smi: str | None) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    if nvidia_smi is not None:
        (tools / "nvidia-smi").write_text(nvidia_smi)
        (tools / "nvidia-smi").chmod(0o755)
    # Only the stand-in (or nothing) where nvidia-smi is looked for; not the machine's own.
    env = {**os.environ, "PATH": str(tools)}
    done = run_script(env)
    assert done.returncode == 2, done.stdout + done.stderr
    [row] = [line for line in done.stdout.splitlines() if line.startswith("gpus ")]
    assert row.split()[1] == "SKIP" and "no GPU" in row, done.stdout
    assert done.stdout.splitlines()[-1].startswith("SKIP: 0 passed, 0 failed, 1 skipped"), done.stdout

    done = run_script(env, "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert (document["result"], document["exit_code"], document["gpus"]) == ("SKIP", 2, [])
    [check] = document["checks"]
    assert (check["name"], check["status"]) == ("gpus", "SKIP")
    said = (
        "nvidia-smi is not on PATH" if nvidia_smi is None else "couldn't communicate with the NVIDIA driver"
    )
    assert said in check["detail"] and said in document["reason"]
    assert not Path(document["work_dir"]).exists()


@needs_root_and_bwrap
def test_not_as_root_the_check_is_skipped(stand_in_gpus) -> None:
    nobody = [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    try:
        subprocess.run([*nobody, sys.executable, "-c", "import mwms, httpx"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the checkout's Python cannot run as nobody here")
    done = run_script({**stand_in_gpus, "HOME": "/"}, "--json", user=nobody)
    assert done.returncode == 2, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["result"] == "SKIP" and len(document["gpus"]) == 2
    assert statuses(document) == {"gpus": "PASS", "sandbox": "SKIP"}
    assert document["reason"].startswith("not root")
