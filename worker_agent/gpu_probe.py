"""The agent proves its sandbox before it offers a GPU: a task given that GPU sees exactly that GPU.

At start, for each GPU it found (nvidia-smi) whose node it located (worker_agent/gpu_nodes.py), a sandboxed
agent runs `nvidia-smi -L` as a task would: in a sandbox built as a task's, as a task uid, with that GPU's
node and the control devices bound. The GPU is offered only when the listing names exactly its UUID. A
wrong node (another GPU's), a driver that needs a device the sandbox lacks, or a listing of nothing would
otherwise surface as a job training on the CPU without a word, or on another job's GPU. The reason for each
GPU left out goes to the log. An agent without a sandbox (`--sandbox off`, or no bubblewrap) checks nothing:
its tasks see every node, and CUDA_VISIBLE_DEVICES picks theirs.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from mwms.v1 import agent_pb2
from mwms.worker_agent import seccomp
from mwms.worker_agent.devices import GpuQuery
from mwms.worker_agent.gpu_nodes import DriverPaths, GpuNode, gpu_nodes, locate_nodes
from mwms.worker_agent.sandbox import Confinement, SandboxError
from mwms.worker_agent.task_env import inherited_environment
from mwms.worker_agent.task_users import TaskUserError

log = logging.getLogger("mwms.agent.devices")

PROBE_TIMEOUT_S = 30.0
MAX_PARALLEL_PROBES = 8
MAX_SHOWN_CHARS = 200
_LISTED_UUID = re.compile(r"UUID:\s*(GPU-[0-9A-Za-z-]+)")


def vet_gpus(gpus: Sequence[agent_pb2.Device], confinement: Confinement, driver: DriverPaths) -> GpuQuery:
    """The GPUs to offer: each with its node and, where tasks are sandboxed, proved to be what a task sees."""
    search = locate_nodes(gpus, driver, need_nodes=confinement.sandboxed)
    reasons = list(search.left_out)
    offered = search.offered
    if confinement.sandboxed and offered:
        failures = prove_sandbox(confinement, list(gpu_nodes(offered).values()))
        reasons += [failures[d.index] for d in offered if d.index in failures]
        offered = [d for d in offered if d.index not in failures]
    for reason in reasons:
        log.error("%s", reason)
    if offered and confinement.sandboxed:
        log.info(
            "sandbox checked: a task given GPU %s sees exactly that GPU",
            ", ".join(f"{d.index} ({d.node})" for d in offered),
        )
    return GpuQuery(offered, "" if offered else "; ".join(reasons))


def prove_sandbox(confinement: Confinement, gpus: Sequence[GpuNode]) -> dict[int, str]:
    """Host index -> why a sandboxed task given that GPU would not see exactly it; absent: it would."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {gpu.index: f"GPU {gpu.index} is not offered: nvidia-smi is not on PATH" for gpu in gpus}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(gpus)) or 1) as pool:
        reasons = list(pool.map(lambda gpu: _probe(confinement, smi, gpu), gpus))
    found = dict(zip([gpu.index for gpu in gpus], reasons, strict=True))
    return {index: why for index, why in found.items() if why}


def _probe(confinement: Confinement, smi: str, gpu: GpuNode) -> str:
    """Why a sandboxed `nvidia-smi -L` with only `gpu` bound does not list exactly it ("" when it does)."""
    task_id = f"gpu-probe-{gpu.index}"
    prefix = f"GPU {gpu.index} ({gpu.uuid}) is not offered: a sandboxed task given it (node {gpu.node})"
    try:
        identity = confinement.users.acquire(task_id)
    except TaskUserError as error:
        return f"{prefix} cannot be checked: {error}"
    try:
        argv = confinement.probe_argv([smi, "-L"], identity, [gpu])
        env = inherited_environment(os.environ)
        with seccomp.filled_argv(argv) as (filled, fds):
            done = subprocess.run(
                filled,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
                env=env,
                pass_fds=fds,
            )
    except subprocess.TimeoutExpired:
        return f"{prefix} ran nvidia-smi -L, which did not answer within {PROBE_TIMEOUT_S:.0f} s"
    except (OSError, SandboxError) as error:
        return f"{prefix} could not be started: {error}"
    finally:
        confinement.users.release(task_id)
    listed = [uuid.lower() for uuid in _LISTED_UUID.findall(done.stdout)]
    if listed == [gpu.uuid.lower()]:
        return ""
    said = " ".join((done.stdout + " " + done.stderr).split())[:MAX_SHOWN_CHARS]
    if not listed:
        seen = "sees no GPU"
    else:
        seen = f"sees {', '.join(listed)}"
    return (
        f"{prefix} {seen} (nvidia-smi -L exited {done.returncode}: {said!r}); check that the node is "
        "this GPU's (its minor number) and that the driver needs no other device, or run with --sandbox off"
    )
