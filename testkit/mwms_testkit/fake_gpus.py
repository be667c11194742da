"""An agent process whose GPUs are stand-ins, for tests of GPUs on machines without one.

The agent finds two GPUs through an `nvidia-smi` script put first on its PATH (its ordinary detection) and
samples them with MWMS_DEVICE_SAMPLER (its testing hook) instead of NVML: the hook reads what to report
from a JSON file the test rewrites (`write_samples`). Their driver files are stand-ins too
(`write_stand_in_driver`, the agent's MWMS_NVIDIA_PROC_DIR and MWMS_NVIDIA_DEV_DIR hooks): a
/proc/driver/nvidia/gpus of their minor numbers, which differ from their indices as on a machine whose
driver probed them in another order (GPU 0 is /dev/nvidia1, GPU 1 is /dev/nvidia0), and their device nodes
as plain files. Inside a sandbox, `nvidia-smi -L` lists the GPUs whose node is bound at /dev/nvidia<minor>,
as the real one lists those CUDA can open. Everything else is the real agent.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from mwms_testkit.cluster import Cluster, Process, wait_until
from mwms_testkit.parallel import port_range

UUIDS = ("GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111")
MINORS = (1, 0)  # GPU 0's node is /dev/nvidia1: the driver's probe order is not the index order
BUS_IDS = ("0000:3b:00.0", "0000:5e:00.0")

FAKE_NVIDIA_SMI = f"""#!/bin/sh
if [ "$1" = "-L" ]; then
    n=0
    if [ -e /dev/nvidia{MINORS[0]} ]; then echo "GPU $n: Stand-in GPU (UUID: {UUIDS[0]})"; n=$((n+1)); fi
    if [ -e /dev/nvidia{MINORS[1]} ]; then echo "GPU $n: Stand-in GPU (UUID: {UUIDS[1]})"; n=$((n+1)); fi
    if [ $n -eq 0 ]; then echo "No devices found."; exit 6; fi
    exit 0
fi
printf '0, Stand-in GPU, {UUIDS[0]}, 81920\\n'
printf '1, Stand-in GPU, {UUIDS[1]}, 81920\\n'
"""

SAMPLER = """
import json, os

def sample():
    with open(os.environ["FAKE_GPU_SAMPLES"]) as f:
        return json.load(f)  # Python's json reads NaN
"""


def two_gpus(util0: float, util1: float) -> list[dict[str, Any]]:
    """Good samples of both stand-in GPUs with the given utilisation."""
    return [
        {
            "index": 0,
            "utilization_pct": util0,
            "memory_used_mib": 4096,
            "memory_total_mib": 81920,
            "temperature_c": 55.0,
        },
        {
            "index": 1,
            "utilization_pct": util1,
            "memory_used_mib": 2048,
            "memory_total_mib": 81920,
            "temperature_c": 50.0,
        },
    ]


def write_stand_in_driver(directory: Path) -> dict[str, str]:
    """Writes the stand-in GPUs' /proc/driver/nvidia/gpus and /dev nodes under `directory`; returns the
    agent's variables that point it there."""
    proc = directory / "proc-driver-nvidia-gpus"
    dev = directory / "dev"
    for bus_id, uuid, minor in zip(BUS_IDS, UUIDS, MINORS, strict=True):
        (proc / bus_id).mkdir(parents=True, exist_ok=True)
        (proc / bus_id / "information").write_text(
            f"Model: \t\t Stand-in GPU\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nVideo BIOS: \t ??.??.??.??.??\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {bus_id}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
        )
    dev.mkdir(parents=True, exist_ok=True)
    for name in (*(f"nvidia{m}" for m in MINORS), "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    return {"MWMS_NVIDIA_PROC_DIR": str(proc), "MWMS_NVIDIA_DEV_DIR": str(dev)}


def write_samples(path: Path, samples: list[dict[str, Any]]) -> None:
    """What the agent's sampler reports from now on (written whole, then moved into place)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(samples))
    partial.replace(path)


def start_fake_gpu_agent(
    cluster: Cluster,
    name: str,
    samples: Path,
    *,
    port_low: int,
    interval: float = 0.5,
    extra_env: dict[str, str] | None = None,
) -> Process:
    """Starts an agent with two stand-in GPUs sampled every `interval` s; returns once it is online."""
    tools = cluster.root / f"{name}-tools"
    tools.mkdir(exist_ok=True)
    smi = tools / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    (tools / "fake_gpu_sampler.py").write_text(SAMPLER)
    if not samples.exists():
        write_samples(samples, two_gpus(10.0, 20.0))
    env = {
        **cluster.agent_environment(),
        "PATH": f"{tools}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(tools),
        "MWMS_DEVICE_SAMPLER": "fake_gpu_sampler:sample",
        "FAKE_GPU_SAMPLES": str(samples),
        **write_stand_in_driver(tools),
        **(extra_env or {}),
    }
    args = ["agent", "--server", f"127.0.0.1:{cluster.grpc_port}", "--name", name, "--work-dir"]
    args += [str(cluster.root / name), "--advertise-address", "127.0.0.1"]
    args += ["--port-range", port_range(port_low), "--device-sample-interval", str(interval)]
    agent = cluster._spawn(name, args, env)
    cluster.agents[name] = agent
    wait_until(lambda: cluster.agent_online(name), 60, f"agent {name} online\n{agent.log_tail()}")
    return agent


def write_fake_gpu_tools(directory: Path, samples: Path) -> dict[str, str]:
    """Writes the stand-in GPUs' `nvidia-smi`, sampler and driver files under `directory` (made readable to
    every user: a sandboxed task runs that `nvidia-smi` as a uid of its own) and the samples the sampler
    reports, unless `samples` exists; returns the variables that show them to an agent started with them,
    or to a program that starts one (scripts/gpu_check.py), PATH first."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    smi = directory / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    (directory / "fake_gpu_sampler.py").write_text(SAMPLER)
    if not samples.exists():
        write_samples(samples, two_gpus(10.0, 20.0))
    return {
        "PATH": f"{directory}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(directory),
        "MWMS_DEVICE_SAMPLER": "fake_gpu_sampler:sample",
        "FAKE_GPU_SAMPLES": str(samples),
        **write_stand_in_driver(directory),
    }
