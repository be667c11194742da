"""One-shot check of a GPU machine: does each sandboxed task see exactly its GPUs, at full speed?

Usage (as root, from the checkout, with mwms installed in .venv; `make gpu-check` runs it):

    .venv/bin/python scripts/gpu_check.py [--timeout S] [--json] [--keep]

1. Lists the GPUs outside any sandbox: `nvidia-smi --query-gpu` and `nvidia-smi -L`, and each one's minor
   number (its node /dev/nvidia<minor>) from /proc/driver/nvidia/gpus/*/information, else NVML.
2. Measures each GPU's bf16 matmul throughput outside the sandbox, as the baseline: TensorFlow when it is
   importable, else PyTorch, else none (n/a). CUDA itself is asked through libcuda (ctypes), no framework.
3. Starts a throwaway coordinator (`mwms server` on loopback, free ports, a temporary data dir) and one
   agent as root with `--sandbox bwrap` offering every GPU, and waits until it registered its GPUs.
4. Submits one probe job per GPU (1 worker, 1 GPU, all held at once so each lands on another GPU, then
   measured one after the other), one 2-GPU job when there are two GPUs or more, and one 2-worker 1-GPU
   job whose workers share the agent. The probe (written to a temporary dir) prints what it was told
   (CUDA_VISIBLE_DEVICES, MWMS_GPU_UUIDS, MWMS_NUM_GPUS) and what it sees: the /dev/nvidia* nodes, what
   `nvidia-smi -L` lists, the devices CUDA counts (cuInit, cuDeviceGetCount, cuDeviceGetUuid), its bf16
   matmul throughput; the 2-worker job's workers also read each other's file in /dev/shm.
5. Checks, per GPU: CUDA_VISIBLE_DEVICES names exactly the UUID the API gives the task (device_uuids);
   only its node is there; nvidia-smi lists only it; CUDA sees exactly one device, with that UUID; the
   throughput inside is at least 0.9 x the baseline; the job's device telemetry (GET
   /api/v1/jobs/{id}/devices) holds a series of that GPU with utilisation and memory.
6. Prints a table of the checks (PASS/FAIL/SKIP, with the figures), or with --json one JSON document.

Exit status: 0 when no check failed (checks that cannot run here, such as CUDA's without a CUDA driver,
say SKIP), 1 when one did (or the run timed out), 2 when the check was skipped as a whole: no GPU, not
root, no bubblewrap; 130 on Ctrl-C. --timeout bounds the whole run (default 600 s, the clean-up
included); the coordinator, the agent and its tasks are always stopped, and the temporary directory
(logs, the agent's work dir, the coordinator's data) is removed unless --keep.

The matmul runs in this script's Python, the one the agent's tasks get too (`python` in a job's command is
the agent's interpreter): where PyTorch is installed system-wide, make the venv with --system-site-packages.
Needed besides mwms (and its httpx): nothing; libcuda is asked through ctypes, and no network is used.

The agent's testing hooks MWMS_NVIDIA_PROC_DIR, MWMS_NVIDIA_DEV_DIR and MWMS_DEVICE_SAMPLER, when set,
are honoured here and passed on to the agent (tests/system/deploy/test_gpu_check.py runs this script with the
stand-in GPUs of testkit/mwms_testkit/fake_gpus.py); every other MWMS_ variable of the calling shell is not passed on.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mwms.worker_agent.devices import query_gpus
from mwms.worker_agent.gpu_nodes import DriverPaths, nvml_minor_numbers, read_minor_numbers
from mwms.worker_agent.job_shares import JobShares

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
EXIT_PASS, EXIT_FAIL, EXIT_SKIP, EXIT_INTERRUPTED = 0, 1, 2, 130
MARKER = "MWMS_GPU_CHECK "
THROUGHPUT_RATIO = 0.9
AGENT_NAME = "gpu-check"
# Outside the default range of a production agent (60000-60999): two agents on a machine need their own.
DEFAULT_TASK_UIDS = "61000-61099"
# The agent's testing hooks (worker_agent/gpu_nodes.py, worker_agent/device_telemetry.py), passed on to it.
AGENT_HOOKS = ("MWMS_NVIDIA_PROC_DIR", "MWMS_NVIDIA_DEV_DIR", "MWMS_DEVICE_SAMPLER")
# How long the clean-up may take at most (stopping the agent and its tasks, then the coordinator).
CLEANUP_RESERVE_S = 30.0
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
LISTED_UUID = re.compile(r"UUID:\s*(GPU-[0-9A-Za-z-]+)")
GPU_NODE = re.compile(r"nvidia\d+")
LOG_TAIL_LINES = 20
# How long the one-GPU probe jobs may take to start, all of them (their probes then wait for the script).
ARRIVAL_S = 180.0

# The program every probe job runs, and this script outside the sandbox for the baseline.
PROBE = r'''
"""mwms GPU check probe (written and run by scripts/gpu_check.py): what a task was told of its GPUs and
what it sees of them, printed as one JSON line after the marker."""
import argparse, ctypes, json, os, re, shutil, socket, subprocess, time

MARKER = "MWMS_GPU_CHECK "
CUDA_ERROR_STUB_LIBRARY = 34


def nodes():
    try:
        return sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    except OSError as error:
        return [f"(cannot list /dev: {error})"]


def nvidia_smi_list():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"ran": False, "error": "nvidia-smi is not on PATH", "uuids": [], "output": ""}
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"ran": False, "error": f"nvidia-smi -L: {error}", "uuids": [], "output": ""}
    output = (done.stdout + done.stderr).strip()[-4000:]
    uuids = re.findall(r"UUID:\s*(GPU-[0-9A-Za-z-]+)", done.stdout)
    return {"ran": True, "exit_code": done.returncode, "output": output, "uuids": uuids}


def cuda_devices():
    """The devices CUDA's driver API counts, with their UUIDs: libcuda through ctypes, no framework."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return {"ok": False, "driver": False, "error": str(error),
                "count": 0, "uuids": [], "names": []}

    def error_name(code):
        text = ctypes.c_char_p()
        try:
            if lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
                return text.value.decode()
        except AttributeError:
            pass
        return f"CUresult {code}"

    found = {"ok": False, "driver": True, "error": "", "count": 0, "uuids": [], "names": []}
    code = lib.cuInit(0)
    if code != 0:
        found["driver"] = code != CUDA_ERROR_STUB_LIBRARY
        found["error"] = f"cuInit: {error_name(code)}"
        return found
    count = ctypes.c_int()
    code = lib.cuDeviceGetCount(ctypes.byref(count))
    if code != 0:
        found["error"] = f"cuDeviceGetCount: {error_name(code)}"
        return found
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or getattr(lib, "cuDeviceGetUuid", None)
    for ordinal in range(count.value):
        device = ctypes.c_int()
        code = lib.cuDeviceGet(ctypes.byref(device), ordinal)
        if code != 0:
            found["error"] = f"cuDeviceGet({ordinal}): {error_name(code)}"
            return found
        raw = (ctypes.c_ubyte * 16)()
        uuid = ""
        if get_uuid is not None and get_uuid(raw, device) == 0:
            h = bytes(raw).hex()
            uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(name, 256, device)
        found["uuids"].append(uuid)
        found["names"].append(name.value.decode(errors="replace"))
    found["count"] = count.value
    found["ok"] = True
    return found


def timed(step, sync, seconds, size):
    """Runs `step` (one matrix product) for `seconds` after a warm-up; TFLOP/s of 2 n^3 per product."""
    warm_until = time.perf_counter() + min(1.0, max(seconds / 3, 0.2))
    while True:
        for _ in range(5):
            step()
        sync()
        if time.perf_counter() >= warm_until:
            break
    products, start = 0, time.perf_counter()
    while True:
        for _ in range(10):
            step()
        sync()
        products += 10
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return {"tflops": 2 * size**3 * products / elapsed / 1e12, "products": products,
            "seconds": round(elapsed, 3), "matrix_size": size, "dtype": "bfloat16"}


def bench_torch(seconds, size, device):
    import torch

    if device == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
        where, sync, count = "cuda", torch.cuda.synchronize, torch.cuda.device_count()
    else:
        where, sync, count = "cpu", (lambda: None), 0
    a = torch.randn(size, size, device=where, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=where, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    found = timed(lambda: torch.matmul(a, b, out=c), sync, seconds, size)
    return {**found, "framework": "torch", "framework_devices": count}


def bench_tensorflow(seconds, size, device):
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and not gpus:
        raise RuntimeError("TensorFlow sees no GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    with tf.device("/GPU:0" if device == "gpu" else "/CPU:0"):
        a = tf.cast(tf.random.normal((size, size)), tf.bfloat16)
        b = tf.cast(tf.random.normal((size, size)), tf.bfloat16)
        last = [a]

        def step():
            last[0] = tf.linalg.matmul(a, b)

        def sync():
            last[0][0, 0].numpy()  # the GPU's stream runs in order: every product before it is done

        found = timed(step, sync, seconds, size)
    return {**found, "framework": "tensorflow", "framework_devices": len(gpus)}


def bench(frameworks, seconds, size, device="gpu"):
    """With the first of `frameworks` (comma-separated) that works: a CPU-only TensorFlow, say, sees no
    GPU, and PyTorch may then measure."""
    tried = []
    for framework in [f for f in frameworks.split(",") if f and f != "none"]:
        try:
            if framework == "torch":
                return {**bench_torch(seconds, size, device), "tried": tried}
            if framework == "tensorflow":
                return {**bench_tensorflow(seconds, size, device), "tried": tried}
            tried.append(f"{framework}: unknown")
        except Exception as error:  # noqa: BLE001 - reported, the checks say what it means
            tried.append(f"{framework}: {type(error).__name__}: {error}"[:500])
    if tried:
        return {"error": "; ".join(tried), "framework": frameworks}
    return {"skipped": "neither TensorFlow nor PyTorch is importable", "framework": "none"}


class Baton:
    """The script holds every per-GPU probe here until all of them run (so each holds another GPU),
    then lets them measure one at a time."""

    def __init__(self, address, key, wait_s):
        host, _, port = address.rpartition(":")
        self.error = ""
        self.sock = None
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=10)
            hello = {"key": key, "job": os.environ.get("MWMS_JOB_ID", ""),
                     "task": os.environ.get("MWMS_TASK_INDEX", "")}
            self.sock.sendall((json.dumps(hello) + "\n").encode())
            self.sock.settimeout(wait_s)
            said = self.sock.makefile("rb").readline().strip()
            if said != b"go":
                self.error = f"the script said {said!r}, not go"
        except (OSError, ValueError) as error:
            self.error = f"baton {address}: {error}"

    def done(self):
        if self.sock is not None:
            try:
                self.sock.sendall(b"done\n")
                self.sock.close()
            except OSError:
                pass


def exchange_shm(index, wait_s=60):
    """Leaves a file only its owner may read in /dev/shm (as NCCL's are) and reads the peer's."""
    mine, peer = f"/dev/shm/mwms-gpu-check-{index}", f"/dev/shm/mwms-gpu-check-{1 - index}"
    try:
        # Written whole under another name, then renamed: the peer, which waits for the name, never reads
        # the file between its creation and its write.
        with open(os.open(f"{mine}.partial", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "w") as f:
            f.write(str(index))
        os.rename(f"{mine}.partial", mine)
    except OSError as error:
        return {"wrote": False, "error": str(error), "peer": None}
    deadline = time.monotonic() + wait_s
    while not os.path.exists(peer) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        with open(peer) as f:
            seen = f.read()
    except OSError as error:
        return {"wrote": True, "error": f"{peer}: {error}", "peer": None}
    time.sleep(2)  # the peer reads this task's file before it goes
    return {"wrote": True, "error": "", "peer": seen}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["outside", "gpu", "multi", "shm"], required=True)
    parser.add_argument("--framework", default="none")
    parser.add_argument("--bench-seconds", type=float, default=0.0)
    parser.add_argument("--matrix-size", type=int, default=8192)
    parser.add_argument("--bench-device", default="gpu")
    parser.add_argument("--baton", default="")
    parser.add_argument("--key", default="")
    parser.add_argument("--wait-s", type=float, default=300.0)
    parser.add_argument("--hold-s", type=float, default=0.0)
    args = parser.parse_args()
    started = time.monotonic()
    variables = ("CUDA_VISIBLE_DEVICES", "MWMS_GPU_UUIDS", "MWMS_NUM_GPUS", "MWMS_JOB_ID", "MWMS_TASK_INDEX")
    result = {
        "role": args.role,
        "uid": os.getuid(),
        "env": {name: os.environ.get(name) for name in variables},
        "nodes": nodes(),
        "nvidia_smi": nvidia_smi_list(),
        "cuda": cuda_devices(),
    }
    if args.role == "shm":
        result["shm"] = exchange_shm(int(os.environ.get("MWMS_TASK_INDEX", "0")))
    baton = Baton(args.baton, args.key, args.wait_s) if args.baton else None
    if baton is not None:
        result["baton"] = baton.error or "ok"
    if args.bench_seconds > 0:
        if args.bench_device == "gpu" and not result["cuda"]["ok"]:
            result["bench"] = {"skipped": f"no CUDA: {result['cuda']['error']}", "framework": args.framework}
        else:
            result["bench"] = bench(args.framework, args.bench_seconds, args.matrix_size, args.bench_device)
    if baton is not None:
        baton.done()
    time.sleep(max(0.0, started + args.hold_s - time.monotonic()))  # device samples during the task
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
'''


class TimedOut(BaseException):
    """--timeout was reached (raised by the alarm; a BaseException, so no `except Exception` hides it)."""


class Skipped(Exception):
    """The check cannot run on this machine as a whole (no GPU, not root, no sandbox): exit 2."""


@dataclass
class Check:
    name: str
    status: str
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int
    outside: dict[str, Any] = field(default_factory=dict)  # the probe's bench outside the sandbox

    @property
    def node(self) -> str:
        return f"/dev/nvidia{self.minor}" if self.minor >= 0 else ""

    @property
    def tflops_outside(self) -> float | None:
        value = self.outside.get("tflops")
        return float(value) if isinstance(value, int | float) else None


@dataclass
class Report:
    checks: dict[str, Check] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    listing: dict[str, Any] = field(default_factory=dict)
    framework: str = "none"
    bench: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""
    stopped: str = ""  # why the run ended early (timeout, Ctrl-C, an error)
    interrupted: bool = False
    jobs: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    work_dir: str = ""
    kept: bool = False
    started: float = field(default_factory=time.monotonic)

    def add(self, name: str, status: str, detail: str, **figures: Any) -> None:
        self.checks[name] = Check(name, status, detail, {k: v for k, v in figures.items() if v is not None})
        if name not in self.expected:
            self.expected.append(name)

    def expect(self, names: Sequence[str]) -> None:
        self.expected += [name for name in names if name not in self.expected]

    def finish(self) -> None:
        """Every expected check not made: FAIL, saying why the run ended before it."""
        why = self.stopped.splitlines()[0] if self.stopped else "not reached"
        for name in self.expected:
            if name not in self.checks:
                self.checks[name] = Check(name, FAIL, f"not run: {why}")

    def ordered(self) -> list[Check]:
        return [self.checks[name] for name in self.expected if name in self.checks]

    def counts(self) -> dict[str, int]:
        statuses = [check.status for check in self.checks.values()]
        return {status: statuses.count(status) for status in (PASS, FAIL, SKIP)}

    @property
    def result(self) -> str:
        if self.skipped:
            return SKIP
        return FAIL if self.counts()[FAIL] or self.stopped else PASS

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return {PASS: EXIT_PASS, FAIL: EXIT_FAIL, SKIP: EXIT_SKIP}[self.result]

    def document(self) -> dict[str, Any]:
        return {
            "result": self.result,
            "exit_code": self.exit_code,
            "reason": self.skipped or self.stopped,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "host": socket.gethostname(),
            "framework": self.framework,
            "bench": self.bench,
            "gpus": [
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "name": gpu.name,
                    "memory_mib": gpu.memory_mib,
                    "minor": gpu.minor,
                    "node": gpu.node,
                    "tflops_outside": gpu.tflops_outside,
                    "outside": gpu.outside,
                }
                for gpu in self.gpus
            ],
            "listing": self.listing,
            "counts": self.counts(),
            "checks": [
                {"name": c.name, "status": c.status, "detail": c.detail, "figures": c.figures}
                for c in self.ordered()
            ],
            "jobs": self.jobs,
            "pids": self.pids,
            "work_dir": self.work_dir,
            "kept": self.kept,
            "logs": self.logs,
        }

    def table(self) -> str:
        out = io.StringIO()
        counts = self.counts()
        print(f"mwms GPU check on {socket.gethostname()}: {len(self.gpus)} GPU(s)", file=out)
        if self.bench and self.framework != "none":
            b = self.bench
            print(
                f"matmul: {self.framework}, bf16 {b['matrix_size']}x{b['matrix_size']}, {b['seconds']:g} s",
                file=out,
            )
        elif self.bench:
            print("matmul: n/a (neither TensorFlow nor PyTorch is importable)", file=out)
        for gpu in self.gpus:
            tflops = gpu.tflops_outside
            outside = f"{figure(tflops)} TFLOP/s outside" if tflops is not None else "outside: n/a"
            why = gpu.outside.get("skipped") or gpu.outside.get("error")
            if tflops is None and why:
                outside += f" ({why})"
            print(
                f"  GPU {gpu.index}  {gpu.uuid}  {gpu.name}  {gpu.memory_mib} MiB  "
                f"{gpu.node or 'node unknown'}  {outside}",
                file=out,
            )
        checks = self.ordered()
        width = max([len("CHECK"), *(len(c.name) for c in checks)])
        print(f"\n{'CHECK':<{width}}  RESULT  DETAIL", file=out)
        for check in checks:
            print(f"{check.name:<{width}}  {check.status:<6}  {check.detail}", file=out)
        elapsed = time.monotonic() - self.started
        summary = f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped in {elapsed:.1f} s"
        reason = self.skipped or self.stopped
        print(f"\n{self.result}: {summary}" + (f"; {reason}" if reason else ""), file=out)
        for name, tail in self.logs.items():
            print(f"\nlast lines of the {name}'s log:\n{tail}", file=out)
        if self.kept:
            print(f"\nkept: {self.work_dir} (logs: server.log, agent.log)", file=out)
        return out.getvalue()


def figure(tflops: float) -> str:
    """A TFLOP/s figure: one decimal (667.5), more digits where it is small (a CPU's 0.0912)."""
    return f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"


def progress(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def within(self, seconds: float) -> float:
        """`seconds`, or less where less time is left (at least a moment: the alarm ends the run)."""
        return max(0.1, min(seconds, self.left()))


def wait_for(predicate: Callable[[], Any], seconds: float, interval: float = 0.3) -> Any:
    """Polls until `predicate` returns something truthy (returned), or `seconds` passed (its last value)."""
    until = time.monotonic() + seconds
    while True:
        value = predicate()
        if value or time.monotonic() >= until:
            return value
        time.sleep(interval)


# --- step 1: the GPUs outside any sandbox --------------------------------------------------------------


def list_gpus(report: Report) -> list[Gpu]:
    query = query_gpus()
    smi = shutil.which("nvidia-smi")
    listing: dict[str, Any] = {"nvidia_smi": smi or ""}
    if smi is not None:
        try:
            done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
            listing["nvidia_smi_l"] = (done.stdout + done.stderr).strip()[-4000:]
        except (OSError, subprocess.TimeoutExpired) as error:
            listing["nvidia_smi_l"] = f"nvidia-smi -L: {error}"
    driver = DriverPaths.from_environment()
    minors = read_minor_numbers(driver.proc_dir)
    listing["minors_from"] = str(driver.proc_dir)
    unknown = [gpu.uuid for gpu in query.gpus if gpu.uuid.lower() not in minors]
    if unknown:
        minors.update(nvml_minor_numbers(unknown))
        listing["minors_from"] += " and NVML"
    report.listing = listing
    gpus = [
        Gpu(g.index, g.uuid, g.name, g.memory_mib, minors.get(g.uuid.lower(), -1))
        for g in sorted(query.gpus, key=lambda g: g.index)
    ]
    report.gpus = gpus
    if not gpus:
        report.add("gpus", SKIP, f"no GPU: {query.why_none}")
        raise Skipped(f"no GPU ({query.why_none})")
    unknown_minor = [gpu for gpu in gpus if gpu.minor < 0]
    described = ", ".join(f"{gpu.index} {gpu.node or '(minor unknown)'}" for gpu in gpus)
    if unknown_minor:
        report.add(
            "gpus",
            FAIL,
            f"{len(gpus)} GPU(s) ({described}); no minor number under {driver.proc_dir} (nor from NVML) for "
            + ", ".join(f"GPU {gpu.index}" for gpu in unknown_minor),
        )
    else:
        report.add("gpus", PASS, f"{len(gpus)} GPU(s): {described}", count=len(gpus))
    return gpus


def prerequisites() -> str:
    """What the sandboxed agent needs and this machine lacks ("" when nothing)."""
    if os.geteuid() != 0:
        return "not root: the agent must run as root to run tasks as a uid of their own (run it with sudo)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed: the agent needs it to drop a task to its uid"
    from mwms.worker_agent.sandbox import SandboxError, find_bwrap

    try:
        find_bwrap("bwrap")
    except SandboxError as error:
        return str(error)
    return ""


def pick_framework(requested: str) -> str:
    """What may multiply the matrices, in the order tried (comma-separated): "auto" is TensorFlow, then
    PyTorch, of those importable here; "none" when neither is."""
    if requested != "auto":
        return requested
    found = [name for name in ("tensorflow", "torch") if importlib.util.find_spec(name) is not None]
    return ",".join(found) or "none"


# --- step 2: the baseline outside the sandbox ----------------------------------------------------------


def outside_environment(visible: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NVIDIA_", "MWMS_"))}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def run_probe_outside(
    probe: Path, args: list[str], visible: str | None, deadline: Deadline
) -> dict[str, Any]:
    """The probe run here, outside any sandbox, with the Python the agent's tasks get."""
    try:
        done = subprocess.run(
            [sys.executable, str(probe), "--role", "outside", *args],
            capture_output=True,
            text=True,
            timeout=deadline.within(600),
            check=False,
            env=outside_environment(visible),
            cwd=probe.parent,
        )
    except subprocess.TimeoutExpired:
        return {"error": "the probe did not finish in time"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line.removeprefix(MARKER))  # type: ignore[no-any-return]
    said = " ".join((done.stdout + done.stderr).split())[-500:]
    return {"error": f"the probe exited {done.returncode} without a result: {said}"}


def baseline(
    gpus: list[Gpu], probe: Path, options: argparse.Namespace, report: Report, deadline: Deadline
) -> dict[str, Any]:
    """CUDA outside the sandbox (all GPUs), then each GPU's throughput alone; returns CUDA's view."""
    seen = run_probe_outside(probe, [], None, deadline)
    cuda = seen.get("cuda") or {"ok": False, "driver": True, "error": seen.get("error", "no result")}
    listed = [gpu.uuid for gpu in gpus]
    if not cuda["ok"]:
        report.add("cuda.outside", SKIP, cuda_unusable(cuda))
    elif [u.lower() for u in cuda["uuids"]] == [u.lower() for u in listed]:
        report.add(
            "cuda.outside",
            PASS,
            f"CUDA sees the {cuda['count']} GPU(s) nvidia-smi lists",
            count=cuda["count"],
        )
    else:
        report.add(
            "cuda.outside",
            FAIL,
            f"CUDA sees {cuda['count']} device(s) {cuda['uuids']}, nvidia-smi lists {listed}",
            count=cuda["count"],
        )
    bench_args = ["--bench-seconds", str(options.bench_seconds), "--matrix-size", str(options.matrix_size)]
    for gpu in gpus:
        if not cuda["ok"]:
            gpu.outside = {"skipped": cuda_unusable(cuda)}
        elif report.framework == "none":
            gpu.outside = {"skipped": "neither TensorFlow nor PyTorch is importable"}
        else:
            progress(f"measuring GPU {gpu.index} outside the sandbox ({report.framework})")
            args = [*bench_args, "--framework", report.framework]
            found = run_probe_outside(probe, args, gpu.uuid, deadline)
            gpu.outside = found.get("bench") or {"error": found.get("error", "no result")}
            if "tflops" in gpu.outside:  # the others, and the tasks, use the framework that measured
                report.framework = str(gpu.outside["framework"])
    return cuda


def cuda_unusable(cuda: dict[str, Any]) -> str:
    if not cuda.get("driver"):
        return f"no CUDA driver ({cuda.get('error', '')})"
    return f"CUDA does not work outside the sandbox: {cuda.get('error', '')}"


# --- step 3: a throwaway coordinator and a sandboxed agent ---------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def last_line(self) -> str:
        """Its log's last line (the full log tail goes with the report of a failed run)."""
        lines = [line.strip() for line in self.tail(5).splitlines() if line.strip()]
        return lines[-1][:300] if lines else "(its log is empty)"

    def stop(self, grace: float) -> None:
        """SIGTERM, then after `grace` seconds SIGKILL to its whole process group."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # whatever of its session is left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


class Api:
    def __init__(self, http_port: int, token: str) -> None:
        self.base = f"http://127.0.0.1:{http_port}"
        self.client = httpx.Client(
            base_url=self.base, timeout=20, headers={"Authorization": f"Bearer {token}"}, trust_env=False
        )

    def get(self, path: str, **params: Any) -> Any:
        response = self.client.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def submit(self, digest: str, command: list[str], workers: int, gpus_per_worker: int, name: str) -> str:
        body = {
            "name": name,
            "bundle_digest": digest,
            "command": command,
            "workers": workers,
            "gpus_per_worker": gpus_per_worker,
            "restart": {"max_restarts": 0},
            "preflight": False,
        }
        response = self.client.post("/api/v1/jobs", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"submitting {name}: HTTP {response.status_code}: {response.text[:500]}")
        return str(response.json()["id"])

    def cancel(self, job_id: str) -> None:
        self.client.post(f"/api/v1/jobs/{job_id}/cancel")

    def upload(self, bundle: bytes) -> str:
        response = self.client.post("/api/v1/bundles", files={"file": ("bundle.tar.gz", bundle)})
        if response.status_code not in (200, 201):
            raise RuntimeError(f"uploading the probe: HTTP {response.status_code}: {response.text[:500]}")
        return str(response.json()["digest"])

    def close(self) -> None:
        self.client.close()


class Session:
    """What the run started and made; `cleanup` stops and removes it all, whatever happened."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix="mwms-gpu-check-"))
        self.server: Proc | None = None
        self.agent: Proc | None = None
        self.api: Api | None = None
        self.baton: BatonServer | None = None
        self.job_ids: list[str] = []
        self.grpc_port = 0
        self.agent_dir = self.root / "agent"

    @staticmethod
    def mwms() -> str:
        beside = Path(sys.executable).parent / "mwms"
        found = str(beside) if beside.exists() else shutil.which("mwms")
        if found is None:
            raise RuntimeError(f"no `mwms` command beside {sys.executable} nor on PATH: install mwms first")
        return found

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log_path = self.root / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                [self.mwms(), *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return Proc(name, popen, log_path)

    def cleanup(self, report: Report, seconds: float) -> None:
        until = time.monotonic() + seconds
        if self.baton is not None:
            self.baton.close()
        if self.api is not None:
            self.api.close()
        if self.agent is not None:  # it stops its tasks (SIGTERM, then SIGKILL after its 5 s grace)
            self.agent.stop(max(1.0, until - time.monotonic() - 8))
        kill_job_processes(self.job_ids)
        if self.server is not None:
            self.server.stop(max(1.0, min(10.0, until - time.monotonic() - 3)))
        report.work_dir = str(self.root)
        report.kept = self.keep
        # The agent's /dev/shm dir of its jobs' shares, named after its work dir (left empty at its end).
        shutil.rmtree(JobShares(self.agent_dir).shm_root, ignore_errors=True)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def kill_job_processes(job_ids: Sequence[str]) -> None:
    """SIGKILL to whatever still runs with one of these jobs' MWMS_JOB_ID (a task an agent left behind)."""
    marks = {f"MWMS_JOB_ID={job_id}".encode() for job_id in job_ids}
    if not marks:
        return
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if environ & marks:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def scrubbed_environment(keep: Sequence[str] = ()) -> dict[str, str]:
    """This shell's environment without its MWMS_ settings (a production database URL, a task user, ...)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_") or k in keep}
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_coordinator(session: Session, deadline: Deadline) -> tuple[Api, str]:
    """`mwms server` on loopback and free ports; returns its API (as admin) and the join token."""
    admin, join = "mwms_" + secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    ports_file = session.root / "server-ports.json"
    args = ["server", "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0"]
    args += ["--data-dir", str(session.root / "data"), "--ports-file", str(ports_file)]
    env = {**scrubbed_environment(), "MWMS_ADMIN_TOKEN": admin, "MWMS_JOIN_TOKEN": join}
    server = session.server = session.spawn("server", args, env)

    def ports() -> dict[str, int] | None:
        if server.popen.poll() is not None:
            raise RuntimeError(f"the coordinator exited with {server.popen.returncode}: {server.last_line()}")
        try:
            return json.loads(ports_file.read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, ValueError):
            return None

    found = wait_for(ports, deadline.within(90))
    if not found:
        raise RuntimeError(f"the coordinator did not start within 90 s: {server.last_line()}")
    api = session.api = Api(found["http"], admin)

    def healthy() -> bool:
        try:
            return httpx.get(f"{api.base}/healthz", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_for(healthy, deadline.within(60)):
        raise RuntimeError(f"the coordinator does not answer /healthz: {server.last_line()}")
    session.grpc_port = found["grpc"]
    return api, join


def ephemeral_ports() -> tuple[int, int]:
    """The ports outgoing connections take (net.ipv4.ip_local_port_range)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(size: int = 100) -> int:
    """The first port of `size` consecutive ports outside the ephemeral range that were free a moment ago
    (the agent's --port-range)."""
    ephemeral = ephemeral_ports()
    blocks = [
        low for low in range(10000, 65536 - size, size) if low + size - 1 < ephemeral[0] or low > ephemeral[1]
    ]
    blocks = blocks or list(range(20000, 60000, size))
    random.shuffle(blocks)
    for low in blocks[:50]:
        sockets = []
        try:
            for port in range(low, low + size):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return low
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no block of {size} free ports found for the agent's --port-range")


def start_agent(
    session: Session, api: Api, join: str, options: argparse.Namespace, deadline: Deadline
) -> dict[str, Any]:
    """The agent, as root, sandboxing its tasks with bubblewrap; returns its API record once online."""
    low = free_port_block()
    args = ["agent", "--server", f"127.0.0.1:{session.grpc_port}", "--name", AGENT_NAME]
    args += ["--work-dir", str(session.agent_dir), "--advertise-address", "127.0.0.1"]
    args += ["--port-range", f"{low}-{low + 99}", "--sandbox", "bwrap", "--task-uids", options.task_uids]
    args += ["--device-sample-interval", f"{options.sample_interval:g}", "--stop-grace-seconds", "5"]
    env = {**scrubbed_environment(AGENT_HOOKS), "MWMS_JOIN_TOKEN": join}
    agent = session.agent = session.spawn("agent", args, env)

    def online() -> dict[str, Any] | None:
        if agent.popen.poll() is not None:
            raise RuntimeError(f"the agent exited with {agent.popen.returncode}: {agent.last_line()}")
        for record in api.get("/api/v1/agents"):
            if record["name"] == AGENT_NAME and record["online"]:
                return record  # type: ignore[no-any-return]
        return None

    record = wait_for(online, deadline.within(180), interval=0.5)
    if not record:
        raise RuntimeError(f"the agent did not come online within 180 s: {agent.last_line()}")
    return record  # type: ignore[no-any-return]


def check_registration(report: Report, gpus: list[Gpu], record: dict[str, Any], agent: Proc) -> list[Gpu]:
    """agent.registered: it offers every GPU at its node, sandboxed, a uid per job; returns those offered."""
    devices = {d["uuid"].lower(): d for d in record["devices"] if d["kind"] == "gpu"}
    offered, problems = [], []
    for gpu in gpus:
        device = devices.get(gpu.uuid.lower())
        if device is None:
            problems.append(f"GPU {gpu.index} is not offered")
            continue
        if gpu.node and device["node"] != gpu.node:
            problems.append(f"GPU {gpu.index} is offered at {device['node'] or 'no node'}, not {gpu.node}")
        offered.append(gpu)
    isolation = record.get("task_isolation", "")
    if "bwrap sandbox" not in isolation or "a uid per job" not in isolation:
        problems.append(f"tasks are not in a sandbox with a uid per job: {isolation!r}")
    said = [line for line in agent.tail(400).splitlines() if "is not offered" in line]
    detail = ", ".join(f"GPU {gpu.index} at {gpu.node}" for gpu in offered) + f"; {isolation}"
    if problems:
        report.add("agent.registered", FAIL, "; ".join(problems + said[-3:]), offered=len(offered))
    else:
        report.add("agent.registered", PASS, f"offers {detail}", offered=len(offered))
    check_confinement(report, isolation, agent)
    return offered


def check_confinement(report: Report, isolation: str, agent: Proc) -> None:
    """agent.confined: tasks get a cgroup each, port rules and the seccomp filter on this machine's kernel."""
    missing = [what for what in ("cgroup v", "ports guarded") if what not in isolation]
    warned = [
        line.strip()[-200:]
        for line in agent.tail(400).splitlines()
        if "without a seccomp filter" in line or "not confined" in line or "not held to" in line
    ]
    if missing or warned:
        report.add(
            "agent.confined", FAIL, "; ".join([f"task_isolation {isolation!r} lacks {missing}", *warned])
        )
    else:
        report.add("agent.confined", PASS, isolation)


# --- step 4: the probe jobs --------------------------------------------------------------------------


class BatonServer:
    """Holds the per-GPU probes until all of them run, then lets them measure one at a time."""

    def __init__(self) -> None:
        self.key = secrets.token_hex(16)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.5)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.waiting: dict[str, socket.socket] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="baton", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                conn.settimeout(10)
                hello = json.loads(conn.makefile("rb").readline() or b"{}")
            except (OSError, ValueError):
                conn.close()
                continue
            if not isinstance(hello, dict) or hello.get("key") != self.key:
                conn.close()
                continue
            with self._lock:
                self.waiting[str(hello.get("job", ""))] = conn

    def arrived(self) -> set[str]:
        with self._lock:
            return set(self.waiting)

    def release(self, job_id: str, seconds: float) -> str:
        """Lets that job's probe measure and waits until it says it is done ("" then, else why not)."""
        with self._lock:
            conn = self.waiting.pop(job_id, None)
        if conn is None:
            return "its probe never reached the baton"
        try:
            conn.sendall(b"go\n")
            conn.settimeout(seconds)
            said = conn.makefile("rb").readline().strip()
            return "" if said == b"done" else "its probe ended before it was done"
        except OSError as error:
            return f"its probe did not say it was done: {error}"
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self.sock.close()
        with self._lock:
            for conn in self.waiting.values():
                conn.close()
            self.waiting.clear()


def pack(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def wait_terminal(api: Api, job_ids: Sequence[str], deadline: Deadline) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}

    def done() -> bool:
        for job_id in job_ids:
            jobs[job_id] = api.get(f"/api/v1/jobs/{job_id}")
        return all(job["state"] in TERMINAL for job in jobs.values())

    wait_for(done, deadline.within(600), interval=0.5)
    return jobs


def probe_results(api: Api, job: dict[str, Any], deadline: Deadline) -> tuple[dict[int, dict[str, Any]], str]:
    """Task index -> the probe's result line, from the job's logs; and the logs' tail (for failures)."""
    results: dict[int, dict[str, Any]] = {}
    lines: list[dict[str, Any]] = []

    def read() -> bool:
        nonlocal lines
        lines = api.get(f"/api/v1/jobs/{job['id']}/logs", tail=10000)["lines"]
        for line in lines:
            if line["text"].startswith(MARKER):
                with contextlib.suppress(ValueError):
                    results[int(line["task"])] = json.loads(line["text"].removeprefix(MARKER))
        return len(results) >= int(job["workers"])

    # A job that succeeded printed its lines before it ended; they may reach the coordinator a moment later.
    wait_for(read, deadline.within(10 if job["state"] == "SUCCEEDED" else 2), interval=0.5)
    tail = "\n".join(f"[{x['task']}] {x['text']}" for x in lines if not x["text"].startswith(MARKER))
    return results, tail[-2000:]


def job_failure(job: dict[str, Any], tail: str) -> str:
    reason = f"job {job['id']} {job['state']}: {job['reason']}"
    return reason + (f"; its output: {' | '.join(tail.splitlines()[-5:])}" if tail else "")


def probe_args(role: str, options: argparse.Namespace, framework: str) -> list[str]:
    args = ["python", "probe.py", "--role", role, "--framework", framework]
    args += ["--matrix-size", str(options.matrix_size)]
    return args


def run_gpu_jobs(
    api: Api,
    session: Session,
    digest: str,
    offered: list[Gpu],
    options: argparse.Namespace,
    report: Report,
    deadline: Deadline,
    cuda_ok: bool,
) -> dict[str, dict[str, Any]]:
    """One 1-GPU job per offered GPU, all running at once (each on another GPU), measured one at a time.
    Returns GPU UUID -> {"job": ..., "result": ..., "tail": ...} for the GPUs a job ran on."""
    baton = session.baton = BatonServer()
    hold = max(3.0, 3 * options.sample_interval)
    command = probe_args("gpu", options, report.framework)
    command += ["--baton", baton.address, "--key", baton.key, "--wait-s", f"{deadline.left():.0f}"]
    command += ["--hold-s", f"{hold:g}"]
    if cuda_ok and report.framework != "none":
        command += ["--bench-seconds", f"{options.bench_seconds:g}"]
    job_ids = []
    for number in range(1, len(offered) + 1):
        job_id = api.submit(digest, command, 1, 1, f"gpu-check-1gpu-{number}")
        job_ids.append(job_id)
        session.job_ids.append(job_id)
    progress(f"submitted {len(job_ids)} one-GPU probe job(s); waiting until all run")

    def all_arrived() -> bool:
        arrived = baton.arrived()
        pending = [j for j in job_ids if j not in arrived]
        return all(api.get(f"/api/v1/jobs/{j}")["state"] in TERMINAL for j in pending)

    wait_for(all_arrived, deadline.within(ARRIVAL_S), interval=0.5)
    held = {}
    for job_id in job_ids:
        job = api.get(f"/api/v1/jobs/{job_id}")
        if job_id not in baton.arrived() and job["state"] not in TERMINAL:
            progress(
                f"job {job_id} did not start its probe within {ARRIVAL_S:.0f} s ({job['state']}): cancelled"
            )
            api.cancel(job_id)
        uuids = job["tasks"][0]["device_uuids"] if job["tasks"] else []
        held[job_id] = uuids[0] if len(uuids) == 1 else ""
    order = {gpu.uuid: gpu.index for gpu in offered}
    for job_id in sorted(job_ids, key=lambda j: order.get(held[j], 1 << 30)):
        if job_id in baton.arrived():
            if cuda_ok and report.framework != "none":
                progress(f"measuring GPU {order.get(held[job_id], '?')} in its sandbox (job {job_id})")
            why = baton.release(job_id, deadline.within(600))
            if why:
                progress(f"job {job_id}: {why}")
    jobs = wait_terminal(api, job_ids, deadline)
    ran: dict[str, dict[str, Any]] = {}
    for job_id, job in jobs.items():
        report.jobs[f"gpu-{order.get(held[job_id], '?')}"] = job_id
        results, tail = probe_results(api, job, deadline)
        entry = {"job": job, "result": results.get(0), "tail": tail}
        if held[job_id]:
            ran[held[job_id]] = entry
        else:
            ran[f"unplaced-{job_id}"] = entry
    return ran


# --- step 5: the checks ------------------------------------------------------------------------------


def told_problems(result: dict[str, Any], uuids: list[str]) -> list[str]:
    """What is wrong with what the task was told of its GPUs (and with the uid it ran as)."""
    env, want = result["env"], ",".join(uuids)
    problems = []
    for name in ("CUDA_VISIBLE_DEVICES", "MWMS_GPU_UUIDS"):
        if env.get(name) != want:
            problems.append(f"{name}={env.get(name)!r}, not {want!r}")
    if env.get("MWMS_NUM_GPUS") != str(len(uuids)):
        problems.append(f"MWMS_NUM_GPUS={env.get('MWMS_NUM_GPUS')!r}, not '{len(uuids)}'")
    if result["uid"] == 0:
        problems.append("the task ran as root")
    return problems


def node_problems(result: dict[str, Any], nodes: list[str]) -> list[str]:
    seen = sorted(n for n in result["nodes"] if GPU_NODE.fullmatch(n))
    want = sorted(Path(node).name for node in nodes)
    return [] if seen == want else [f"GPU nodes {seen or 'none'} in /dev, not {want}"]


def smi_problems(result: dict[str, Any], uuids: list[str]) -> list[str]:
    smi = result["nvidia_smi"]
    if not smi["ran"]:
        return [smi["error"]]
    listed = [u.lower() for u in smi["uuids"]]
    if sorted(listed) == sorted(u.lower() for u in uuids):
        return []
    return [
        f"nvidia-smi -L lists {smi['uuids'] or 'nothing'} (exit {smi['exit_code']}: {smi['output'][-200:]!r})"
    ]


def cuda_check(result: dict[str, Any], uuids: list[str], outside: dict[str, Any]) -> Check:
    if not outside.get("ok"):
        return Check("", SKIP, cuda_unusable(outside))
    cuda = result["cuda"]
    if not cuda["ok"]:
        return Check("", FAIL, f"CUDA does not work in the sandbox: {cuda['error']}", {"devices": 0})
    seen = [u.lower() for u in cuda["uuids"]]
    if seen == [u.lower() for u in uuids]:
        return Check(
            "",
            PASS,
            f"CUDA sees {cuda['count']} device(s): {', '.join(cuda['uuids'])}",
            {"devices": cuda["count"]},
        )
    return Check(
        "",
        FAIL,
        f"CUDA sees {cuda['count']} device(s) {cuda['uuids']}, not {uuids}",
        {"devices": cuda["count"]},
    )


def throughput_check(result: dict[str, Any], gpu: Gpu, outside: dict[str, Any], framework: str) -> Check:
    if not outside.get("ok"):
        return Check("", SKIP, f"n/a: {cuda_unusable(outside)}")
    if framework == "none":
        return Check("", SKIP, "n/a: neither TensorFlow nor PyTorch is importable")
    base, inside = gpu.tflops_outside, result.get("bench") or {}
    if base is None:
        return Check("", FAIL, f"no baseline outside the sandbox: {gpu.outside.get('error', gpu.outside)}")
    tflops = inside.get("tflops")
    if not isinstance(tflops, int | float):
        why = inside.get("error") or inside.get("skipped") or "no figure"
        return Check("", FAIL, f"no figure in the sandbox ({why}); outside {figure(base)} TFLOP/s")
    ratio = tflops / base if base else 0.0
    figures = {"tflops_inside": round(tflops, 3), "tflops_outside": round(base, 3), "ratio": round(ratio, 3)}
    detail = (
        f"{figure(tflops)} TFLOP/s in the sandbox, {figure(base)} outside ({ratio:.1%}; at least "
        f"{THROUGHPUT_RATIO:.0%})"
    )
    return Check("", PASS if ratio >= THROUGHPUT_RATIO else FAIL, detail, figures)


def add(report: Report, name: str, check: Check) -> None:
    report.add(name, check.status, check.detail, **check.figures)


def add_problems(report: Report, name: str, problems: list[str], passed: str, **figures: Any) -> None:
    if problems:
        report.add(name, FAIL, "; ".join(problems), **figures)
    else:
        report.add(name, PASS, passed, **figures)


def node_of(record: dict[str, Any], uuid: str) -> str:
    for device in record["devices"]:
        if device["uuid"].lower() == uuid.lower():
            return str(device["node"])
    return ""


def gpu_checks(
    report: Report,
    gpus: list[Gpu],
    ran: dict[str, dict[str, Any]],
    record: dict[str, Any],
    cuda_outside: dict[str, Any],
) -> None:
    for gpu in gpus:
        prefix = f"gpu{gpu.index}"
        entry = ran.get(gpu.uuid)
        if entry is None:
            why = "no one-GPU probe job ran on this GPU"
            unplaced = [e for key, e in ran.items() if key.startswith("unplaced-")]
            if unplaced:
                why += "; " + job_failure(unplaced[0]["job"], unplaced[0]["tail"])
            for suffix in ("job", "env", "nodes", "nvidia_smi", "cuda", "throughput", "telemetry"):
                report.add(f"{prefix}.{suffix}", FAIL, why)
            continue
        job, result = entry["job"], entry["result"]
        task = job["tasks"][0]
        uuids = list(task["device_uuids"])
        if job["state"] != "SUCCEEDED" or result is None:
            why = (
                job_failure(job, entry["tail"])
                if job["state"] != "SUCCEEDED"
                else "no probe result in its logs"
            )
            report.add(f"{prefix}.job", FAIL, why)
            for suffix in ("env", "nodes", "nvidia_smi", "cuda", "throughput"):
                report.add(f"{prefix}.{suffix}", FAIL, f"no probe result: {why}")
            continue
        report.add(f"{prefix}.job", PASS, f"job {job['id']} held {uuids} and succeeded", job=job["id"])
        add_problems(
            report,
            f"{prefix}.env",
            told_problems(result, uuids),
            f"CUDA_VISIBLE_DEVICES = MWMS_GPU_UUIDS = {','.join(uuids)}, MWMS_NUM_GPUS = 1, uid {result['uid']}",
        )
        nodes = [node_of(record, uuid) for uuid in uuids]
        add_problems(
            report,
            f"{prefix}.nodes",
            node_problems(result, nodes),
            f"/dev holds {', '.join(n for n in result['nodes'] if n.startswith('nvidia'))}",
        )
        add_problems(
            report, f"{prefix}.nvidia_smi", smi_problems(result, uuids), "nvidia-smi -L lists only this GPU"
        )
        add(report, f"{prefix}.cuda", cuda_check(result, uuids, cuda_outside))
        add(report, f"{prefix}.throughput", throughput_check(result, gpu, cuda_outside, report.framework))


def telemetry_checks(
    report: Report, api: Api, gpus: list[Gpu], ran: dict[str, dict[str, Any]], agent: Proc, deadline: Deadline
) -> None:
    """gpu<i>.telemetry: the job's devices (GET /api/v1/jobs/{id}/devices) hold a series of its GPU."""
    pending = {gpu.uuid: ran[gpu.uuid]["job"]["id"] for gpu in gpus if gpu.uuid in ran}
    found: dict[str, dict[str, Any]] = {}

    def look() -> bool:
        for uuid, job_id in pending.items():
            if uuid in found:
                continue
            for task in api.get(f"/api/v1/jobs/{job_id}/devices")["tasks"]:
                for series in task["series"]:
                    if series["uuid"].lower() == uuid.lower() and series["points"]:
                        found[uuid] = series
        return len(found) == len(pending)

    wait_for(look, deadline.within(20), interval=1.0)  # samples are written to the database once a second
    no_sampler = [line for line in agent.tail(2000).splitlines() if "no device telemetry" in line]
    for gpu in gpus:
        name = f"gpu{gpu.index}.telemetry"
        if gpu.uuid not in pending:
            continue
        series = found.get(gpu.uuid)
        if series is None:
            why = f"no device series of {gpu.uuid} for job {pending[gpu.uuid]}"
            report.add(
                name, FAIL, why + (f"; the agent said: {no_sampler[-1].strip()}" if no_sampler else "")
            )
            continue
        points = series["points"]
        utilisation = max(p["utilization_pct"] for p in points)
        used = max(p["memory_used_mib"] for p in points)
        total = max(p["memory_total_mib"] for p in points)
        report.add(
            name,
            PASS,
            f"{len(points)} point(s): utilisation up to {utilisation:g} %, memory up to {used} of {total} MiB",
            points=len(points),
            max_utilization_pct=utilisation,
            max_memory_used_mib=used,
            memory_total_mib=total,
        )


def two_gpu_job(
    report: Report,
    api: Api,
    session: Session,
    digest: str,
    record: dict[str, Any],
    options: argparse.Namespace,
    cuda_outside: dict[str, Any],
    deadline: Deadline,
) -> None:
    """two_gpus.*: one task given two GPUs is told and sees exactly those two."""
    job_id = api.submit(digest, probe_args("multi", options, "none"), 1, 2, "gpu-check-two-gpus")
    session.job_ids.append(job_id)
    report.jobs["two-gpus"] = job_id
    progress(f"submitted the 2-GPU probe job {job_id}")
    job = wait_terminal(api, [job_id], deadline)[job_id]
    results, tail = probe_results(api, job, deadline)
    result = results.get(0)
    if job["state"] != "SUCCEEDED" or result is None:
        why = job_failure(job, tail) if job["state"] != "SUCCEEDED" else "no probe result in its logs"
        for suffix in ("job", "env", "nodes", "nvidia_smi", "cuda"):
            report.add(f"two_gpus.{suffix}", FAIL, why)
        return
    uuids = list(job["tasks"][0]["device_uuids"])
    report.add("two_gpus.job", PASS, f"job {job_id} held {uuids} and succeeded", job=job_id)
    problems = told_problems(result, uuids) + ([] if len(uuids) == 2 else [f"it holds {uuids}"])
    add_problems(
        report, "two_gpus.env", problems, f"CUDA_VISIBLE_DEVICES = MWMS_GPU_UUIDS = {','.join(uuids)}"
    )
    nodes = [node_of(record, uuid) for uuid in uuids]
    add_problems(
        report, "two_gpus.nodes", node_problems(result, nodes), f"/dev holds {', '.join(result['nodes'])}"
    )
    add_problems(
        report, "two_gpus.nvidia_smi", smi_problems(result, uuids), "nvidia-smi -L lists exactly its 2 GPUs"
    )
    add(report, "two_gpus.cuda", cuda_check(result, uuids, cuda_outside))


def colocated_job(
    report: Report,
    api: Api,
    session: Session,
    digest: str,
    record: dict[str, Any],
    options: argparse.Namespace,
    deadline: Deadline,
) -> None:
    """colocated.*: two 1-GPU workers of one job on this agent see different GPUs and share /dev/shm."""
    job_id = api.submit(digest, probe_args("shm", options, "none"), 2, 1, "gpu-check-colocated")
    session.job_ids.append(job_id)
    report.jobs["colocated"] = job_id
    progress(f"submitted the 2-worker probe job {job_id}")
    job = wait_terminal(api, [job_id], deadline)[job_id]
    results, tail = probe_results(api, job, deadline)
    if job["state"] != "SUCCEEDED" or len(results) < 2:
        why = job_failure(job, tail) if job["state"] != "SUCCEEDED" else "no probe result of both workers"
        for suffix in ("job", "gpus", "dev_shm"):
            report.add(f"colocated.{suffix}", FAIL, why)
        return
    tasks = {int(t["index"]): t for t in job["tasks"]}
    agents = {t["agent_name"] for t in tasks.values()}
    report.add(
        "colocated.job", PASS, f"job {job_id}: both workers on {', '.join(sorted(agents))}", job=job_id
    )
    problems, held = [], []
    for index in (0, 1):
        uuids = list(tasks[index]["device_uuids"])
        held += uuids
        result = results[index]
        found = told_problems(result, uuids) + node_problems(result, [node_of(record, u) for u in uuids])
        found += smi_problems(result, uuids)
        problems += [f"worker {index}: {p}" for p in found]
    if len(set(held)) != 2:
        problems.append(f"the workers hold {held}, not two different GPUs")
    add_problems(report, "colocated.gpus", problems, f"worker 0 sees only {held[0]}, worker 1 only {held[1]}")
    shm_problems = []
    for index in (0, 1):
        shm = results[index].get("shm") or {}
        if shm.get("peer") != str(1 - index):
            shm_problems.append(
                f"worker {index} did not read its peer's /dev/shm file: {shm.get('error') or shm}"
            )
    add_problems(
        report, "colocated.dev_shm", shm_problems, "each worker read the other's 0600 file in /dev/shm"
    )


# --- the run ------------------------------------------------------------------------------------------


def check_machine(options: argparse.Namespace, report: Report, session: Session, deadline: Deadline) -> None:
    progress("listing the GPUs")
    gpus = list_gpus(report)
    names = ["cuda.outside", "agent.registered", "agent.confined"]
    for gpu in gpus:
        names += [
            f"gpu{gpu.index}.{s}"
            for s in ("job", "env", "nodes", "nvidia_smi", "cuda", "throughput", "telemetry")
        ]
    if len(gpus) >= 2:
        names += [f"two_gpus.{s}" for s in ("job", "env", "nodes", "nvidia_smi", "cuda")]
        names += [f"colocated.{s}" for s in ("job", "gpus", "dev_shm")]
    missing = prerequisites()
    if missing:
        report.add("sandbox", SKIP, missing)
        raise Skipped(missing)
    report.add("sandbox", PASS, "root, bubblewrap and setpriv can sandbox a task as a uid of its own")
    report.expect(names)
    report.framework = pick_framework(options.framework)
    report.bench = {"matrix_size": options.matrix_size, "seconds": options.bench_seconds, "dtype": "bfloat16"}

    probe_dir = session.root / "probe"
    probe_dir.mkdir()
    probe = probe_dir / "probe.py"
    probe.write_text(PROBE)
    cuda_outside = baseline(gpus, probe, options, report, deadline)

    progress("starting a throwaway coordinator")
    api, join = start_coordinator(session, deadline)
    assert session.server is not None
    report.pids["coordinator"] = session.server.popen.pid
    progress("starting a sandboxed agent with every GPU")
    record = start_agent(session, api, join, options, deadline)
    assert session.agent is not None
    report.pids["agent"] = session.agent.popen.pid
    offered = check_registration(report, gpus, record, session.agent)
    if not offered:
        return
    digest = api.upload(pack({"probe.py": PROBE}))
    ran = run_gpu_jobs(api, session, digest, offered, options, report, deadline, bool(cuda_outside.get("ok")))
    gpu_checks(report, gpus, ran, record, cuda_outside)
    telemetry_checks(report, api, gpus, ran, session.agent, deadline)
    if len(gpus) >= 2:
        if len(offered) >= 2:
            two_gpu_job(report, api, session, digest, record, options, cuda_outside, deadline)
            colocated_job(report, api, session, digest, record, options, deadline)
        else:
            for name in names:
                if name.startswith(("two_gpus.", "colocated.")):
                    report.add(name, FAIL, "the agent offers fewer than 2 GPUs")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Check that sandboxed mwms tasks see exactly their GPUs, at full speed (run as root).",
        epilog="Exit status: 0 all checks passed (or were skipped one by one), 1 one failed, 2 the check was "
        "skipped as a whole (no GPU, not root, no bubblewrap), 130 interrupted.",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run [600]")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    parser.add_argument("--bench-seconds", type=float, default=3.0, help="seconds of matmul per GPU [3]")
    parser.add_argument("--matrix-size", type=int, default=8192, help="n of the n x n bf16 matrices [8192]")
    parser.add_argument(
        "--framework",
        choices=["auto", "tensorflow", "torch", "none"],
        default="auto",
        help="what multiplies the matrices: auto is TensorFlow when importable, else PyTorch, else none",
    )
    parser.add_argument(
        "--task-uids",
        default=DEFAULT_TASK_UIDS,
        help=f"the uids of the agent's tasks [{DEFAULT_TASK_UIDS}]; must not overlap a running agent's",
    )
    parser.add_argument(
        "--sample-interval", type=float, default=1.0, help="the agent's --device-sample-interval [1]"
    )
    options = parser.parse_args(argv)
    if options.timeout <= 0 or options.bench_seconds <= 0 or options.matrix_size <= 0:
        parser.error("--timeout, --bench-seconds and --matrix-size must be positive")
    if options.sample_interval <= 0:
        parser.error("--sample-interval must be positive: the telemetry check needs samples")
    return options


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raises TimedOut in the main thread after `seconds` (whatever it is blocked in)."""

    def expired(signum: int, frame: object) -> None:
        raise TimedOut()

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    report = Report()
    reserve = min(CLEANUP_RESERVE_S, options.timeout / 4)
    work = options.timeout - reserve
    deadline = Deadline(work)

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt()

    previous_term = signal.signal(signal.SIGTERM, terminated)
    session: Session | None = None
    try:
        session = Session(options.keep)
        with alarm(work):
            check_machine(options, report, session, deadline)
    except Skipped as skipped:
        report.skipped = str(skipped)
    except TimedOut:
        report.stopped = f"--timeout of {options.timeout:g} s reached"
    except KeyboardInterrupt:
        report.stopped, report.interrupted = "interrupted", True
    except Exception as error:  # noqa: BLE001 - reported as a failure of the run, after the clean-up
        report.stopped = f"{type(error).__name__}: {error}"
        if not isinstance(error, RuntimeError | httpx.HTTPError):
            report.logs["script"] = traceback.format_exc()[-3000:]
    finally:
        # The clean-up is not interrupted (it is bounded: CLEANUP_RESERVE_S).
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if session is not None:
                failing = bool(report.stopped) or any(c.status == FAIL for c in report.checks.values())
                if failing:
                    for proc in (session.agent, session.server):
                        if proc is not None:
                            report.logs[proc.name] = proc.tail()
                if session.server is not None:
                    progress("stopping the agent and the coordinator")
                session.cleanup(report, reserve)
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous_term)
    report.finish()
    if options.json:
        print(json.dumps(report.document(), indent=2))
    else:
        print(report.table(), end="")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
