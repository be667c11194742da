"""Which devices this machine offers: its GPUs (from nvidia-smi) or, without GPUs, a number of CPU slots."""

from __future__ import annotations

import logging
import shutil
import subprocess

from mwms.v1 import agent_pb2

log = logging.getLogger("mwms.agent.devices")

NVIDIA_SMI_QUERY = ["--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader,nounits"]


def detect_devices(slots: int) -> list[agent_pb2.Device]:
    """GPUs when nvidia-smi reports any; otherwise `slots` CPU slot devices."""
    gpus = _query_gpus()
    if gpus:
        return gpus
    return cpu_slot_devices(slots)


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


def _query_gpus() -> list[agent_pb2.Device]:
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return []
    try:
        result = subprocess.run(
            [executable, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("nvidia-smi did not answer (%s); offering CPU slots", error)
        return []
    if result.returncode != 0:
        log.warning("nvidia-smi exited with %d; offering CPU slots", result.returncode)
        return []
    return parse_nvidia_smi(result.stdout)
