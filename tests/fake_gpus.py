"""An agent process whose GPUs are stand-ins, for tests of device telemetry on machines without a GPU.

The agent finds two GPUs through an `nvidia-smi` script put first on its PATH (its ordinary detection) and
samples them with MWMS_DEVICE_SAMPLER (its testing hook) instead of NVML: the hook reads what to report
from a JSON file the test rewrites (`write_samples`). Everything else is the real agent.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from cluster import Cluster, Process, wait_until

FAKE_NVIDIA_SMI = """#!/bin/sh
printf '0, Stand-in GPU, GPU-00000000-0000-0000-0000-000000000000, 81920\\n'
printf '1, Stand-in GPU, GPU-11111111-1111-1111-1111-111111111111, 81920\\n'
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


def write_samples(path: Path, samples: list[dict[str, Any]]) -> None:
    """What the agent's sampler reports from now on (written whole, then moved into place)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(samples))
    partial.replace(path)


def start_fake_gpu_agent(
    cluster: Cluster, name: str, samples: Path, *, port_low: int, interval: float = 0.5
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
    }
    args = ["agent", "--server", f"127.0.0.1:{cluster.grpc_port}", "--name", name, "--work-dir"]
    args += [str(cluster.root / name), "--advertise-address", "127.0.0.1"]
    args += ["--port-range", f"{port_low}-{port_low + 99}", "--device-sample-interval", str(interval)]
    agent = cluster._spawn(name, args, env)
    cluster.agents[name] = agent
    wait_until(lambda: cluster.agent_online(name), 60, f"agent {name} online\n{agent.log_tail()}")
    return agent
