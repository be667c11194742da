"""Device detection: nvidia-smi's CSV when there are GPUs, CPU slots otherwise."""

from __future__ import annotations

import shutil

from mwms.v1 import agent_pb2
from mwms.worker_agent.devices import cpu_slot_devices, detect_devices, parse_nvidia_smi

NVIDIA_SMI_OUTPUT = (
    "0, NVIDIA H200, GPU-1b2c3d4e-0000-1111-2222-333344445555, 143771\n"
    "1, NVIDIA H200, GPU-9f8e7d6c-0000-1111-2222-333344445555, 143771\n"
)


def test_nvidia_smi_csv_becomes_gpu_devices() -> None:
    devices = parse_nvidia_smi(NVIDIA_SMI_OUTPUT)
    assert [(d.kind, d.index, d.name, d.memory_mib) for d in devices] == [
        (agent_pb2.DEVICE_KIND_GPU, 0, "NVIDIA H200", 143771),
        (agent_pb2.DEVICE_KIND_GPU, 1, "NVIDIA H200", 143771),
    ]
    assert devices[1].uuid == "GPU-9f8e7d6c-0000-1111-2222-333344445555"


def test_unparsable_lines_are_skipped() -> None:
    assert parse_nvidia_smi("No devices were found\n") == []
    assert parse_nvidia_smi("x, NVIDIA H200, GPU-1, [N/A]\n") == []


def test_without_gpus_the_agent_offers_cpu_slots() -> None:
    assert [(d.kind, d.index, d.name) for d in cpu_slot_devices(2)] == [
        (agent_pb2.DEVICE_KIND_CPU_SLOT, 0, "cpu-slot-0"),
        (agent_pb2.DEVICE_KIND_CPU_SLOT, 1, "cpu-slot-1"),
    ]
    if shutil.which("nvidia-smi") is None:
        assert detect_devices(3) == cpu_slot_devices(3)
