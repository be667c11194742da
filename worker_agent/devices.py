"""Which devices this machine offers: its GPUs (from nvidia-smi) or, without GPUs, a number of CPU slots.

An agent that finds no GPU says so at start, with the reason (no nvidia-smi, a driver that does not answer,
no device listed), unless `--slots` asked for CPU slots: a GPU machine whose driver is missing would
otherwise register as one CPU slot without a word, and GPU jobs would wait for it forever.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from mwms.v1 import agent_pb2

log = logging.getLogger("mwms.agent.devices")

NVIDIA_SMI_QUERY = ["--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader,nounits"]
NVIDIA_SMI_TIMEOUT_S = 20
MAX_REASON_CHARS = 200


@dataclass(frozen=True)
class GpuQuery:
    """What nvidia-smi reported: the GPUs, or why there are none."""

    gpus: list[agent_pb2.Device]
    why_none: str = ""


def detect_devices(
    slots: int,
    *,
    slots_given: bool = True,
    vet: Callable[[list[agent_pb2.Device]], GpuQuery] | None = None,
) -> list[agent_pb2.Device]:
    """GPUs when nvidia-smi reports any (and `vet`, given them, keeps some: worker_agent/gpu_probe.py);
    otherwise `slots` CPU slot devices. Says in the log what it found: a warning when no GPU was found and
    `--slots` was not given (`slots_given`), or when it is ignored."""
    query = query_gpus()
    if query.gpus and vet is not None:
        query = vet(query.gpus)
    if query.gpus:
        if slots_given:
            log.warning(
                "found %d GPU(s); --slots %d is ignored: an agent with GPUs offers its GPUs, not CPU slots",
                len(query.gpus),
                slots,
            )
        return query.gpus
    offered = f"{slots} CPU slot{'s' if slots != 1 else ''}"
    if slots_given:
        log.info("no GPU found (%s); offering %s as --slots asks", query.why_none, offered)
    else:
        log.warning("%s", no_gpu_warning(query.why_none, offered))
    return cpu_slot_devices(slots)


def no_gpu_warning(why_none: str, offered: str) -> str:
    """The start-up warning of an agent that found no GPU and was not asked for CPU slots."""
    return (
        f"no GPU found ({why_none}): this agent offers {offered} instead, and jobs asking for GPUs "
        "(--gpus-per-worker above 0) will not be placed on it; install or fix the NVIDIA driver for its "
        "GPUs, or pass --slots N to offer N CPU slots on purpose"
    )


def cpu_slot_devices(slots: int) -> list[agent_pb2.Device]:
    """`slots` CPU slot devices named cpu-slot-0, cpu-slot-1, ..."""
    return [
        agent_pb2.Device(kind=agent_pb2.DEVICE_KIND_CPU_SLOT, index=i, name=f"cpu-slot-{i}")
        for i in range(slots)
    ]


def parse_nvidia_smi(output: str) -> list[agent_pb2.Device]:
    """Devices from the CSV that `nvidia-smi --query-gpu=index,name,uuid,memory.total` prints."""
    devices = []
    for line in output.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4:
            continue
        index, name, uuid, memory = fields
        try:
            devices.append(
                agent_pb2.Device(
                    kind=agent_pb2.DEVICE_KIND_GPU,
                    index=int(index),
                    name=name,
                    uuid=uuid,
                    memory_mib=int(float(memory)),
                )
            )
        except ValueError:
            log.warning("ignoring an nvidia-smi line that does not parse: %r", line)
    return devices


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:MAX_REASON_CHARS] if lines else ""


def query_gpus() -> GpuQuery:
    """The GPUs nvidia-smi lists, or an empty list with the reason there are none."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return GpuQuery([], "nvidia-smi is not on PATH: is the NVIDIA driver installed?")
    try:
        result = subprocess.run(
            [executable, *NVIDIA_SMI_QUERY],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return GpuQuery([], f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S} s")
    except OSError as error:
        return GpuQuery([], f"nvidia-smi could not run: {error.strerror or error}")
    if result.returncode != 0:
        said = _first_line(result.stdout) or _first_line(result.stderr)
        return GpuQuery([], f"nvidia-smi exited with {result.returncode}" + (f": {said}" if said else ""))
    gpus = parse_nvidia_smi(result.stdout)
    if not gpus:
        said = _first_line(result.stdout)
        return GpuQuery([], "nvidia-smi listed no GPU" + (f": {said}" if said else ""))
    return GpuQuery(gpus)
