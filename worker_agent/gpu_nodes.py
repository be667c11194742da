"""Which device node is each GPU's: found from its minor number, never assumed from its index.

nvidia-smi numbers GPUs in PCI bus order; the driver gives each its minor number (`/dev/nvidia<minor>`) in
the order it probed them. The two usually agree, but not always, and a sandbox that binds the wrong node
gives a task another task's GPU. The minor number comes from the driver's own file of each GPU,
`/proc/driver/nvidia/gpus/<bus id>/information` ("GPU UUID:" and "Device Minor:"), else from NVML
(`nvmlDeviceGetMinorNumber`). A sandboxed agent offers only the GPUs whose node it found and that exists;
it says why for each one it leaves out. An agent without a sandbox offers its GPUs all the same: CUDA
opens their nodes itself.

MWMS_NVIDIA_PROC_DIR and MWMS_NVIDIA_DEV_DIR (the agent's own environment, never a task's) point it at
other driver files and nodes: the testing hook of testkit/mwms_testkit/fake_gpus.py, whose GPUs are stand-ins.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mwms.v1 import agent_pb2

log = logging.getLogger("mwms.agent.devices")

PROC_DIR_ENV = "MWMS_NVIDIA_PROC_DIR"
DEV_DIR_ENV = "MWMS_NVIDIA_DEV_DIR"
DEFAULT_PROC_DIR = Path("/proc/driver/nvidia/gpus")
DEFAULT_DEV_DIR = Path("/dev")
# Where a task looks for its GPUs' nodes, whatever directory they come from on this machine.
SANDBOX_DEV_DIR = Path("/dev")
# The NVIDIA devices every CUDA process opens besides its GPUs' nodes, and the MIG capability nodes.
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
CONTROL_DIRS = ("nvidia-caps",)
# A driver information file is a few hundred bytes; more is not one.
MAX_INFORMATION_BYTES = 64 * 1024
_UUID_LINE = re.compile(r"^GPU UUID:\s*(\S+)\s*$", re.MULTILINE)
_MINOR_LINE = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class DriverPaths:
    """Where this machine's NVIDIA driver files and device nodes are (the hooks above, else the usual)."""

    proc_dir: Path = DEFAULT_PROC_DIR
    dev_dir: Path = DEFAULT_DEV_DIR

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> DriverPaths:
        return cls(
            Path(env.get(PROC_DIR_ENV) or DEFAULT_PROC_DIR), Path(env.get(DEV_DIR_ENV) or DEFAULT_DEV_DIR)
        )


@dataclass(frozen=True)
class GpuNode:
    """One offered GPU: its host index (nvidia-smi's, NVML's), UUID and minor number (-1: not found)."""

    index: int
    uuid: str
    minor: int = -1

    @property
    def node(self) -> str:
        """Its node as a task sees it ("/dev/nvidia3"), or "" when its minor number is unknown."""
        return str(SANDBOX_DEV_DIR / f"nvidia{self.minor}") if self.minor >= 0 else ""

    def source(self, driver: DriverPaths) -> Path | None:
        """The node on this machine, bound into the task's sandbox at `node`."""
        return driver.dev_dir / f"nvidia{self.minor}" if self.minor >= 0 else None


@dataclass
class NodeSearch:
    """The GPUs to offer, each with its node, and a line for each GPU left out."""

    offered: list[agent_pb2.Device] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def read_minor_numbers(proc_dir: Path) -> dict[str, int]:
    """UUID -> minor number from the driver's `<bus id>/information` files (none: an empty dict)."""
    found: dict[str, int] = {}
    try:
        entries = sorted(proc_dir.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            with open(entry / "information", "rb") as file:
                text = file.read(MAX_INFORMATION_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        uuid, minor = _UUID_LINE.search(text), _MINOR_LINE.search(text)
        if uuid and minor:
            found[uuid.group(1).lower()] = int(minor.group(1))
    return found


def nvml_minor_numbers(uuids: Sequence[str]) -> dict[str, int]:
    """UUID -> minor number from NVML (`pynvml`), for those it knows; empty without NVML."""
    try:
        import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return {}
    found: dict[str, int] = {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError, or a library that does not load: no minor numbers
        return found
    try:
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
                found[uuid.lower()] = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except Exception:  # noqa: BLE001 - this GPU's number is unknown; the others may be known
                continue
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return found


def locate_nodes(gpus: Sequence[agent_pb2.Device], driver: DriverPaths, *, need_nodes: bool) -> NodeSearch:
    """Each GPU with its node (Device.node). With `need_nodes` (a sandbox binds them), a GPU whose minor
    number is unknown or whose node is missing is left out, with the reason."""
    minors = read_minor_numbers(driver.proc_dir)
    missing = [gpu.uuid for gpu in gpus if gpu.uuid.lower() not in minors]
    if missing:
        minors.update(nvml_minor_numbers(missing))
    search = NodeSearch()
    for gpu in gpus:
        device = agent_pb2.Device()
        device.CopyFrom(gpu)
        minor = minors.get(gpu.uuid.lower(), -1)
        found = GpuNode(gpu.index, gpu.uuid, minor)
        source = found.source(driver)
        why = ""
        if source is None:
            why = (
                f"its minor number is unknown (no entry with its UUID {gpu.uuid} under {driver.proc_dir}, "
                "and NVML did not tell): the sandbox cannot bind its device node"
            )
        elif not os.path.exists(source):
            why = f"its device node {source} does not exist (minor number {minor})"
        if why and need_nodes:
            search.left_out.append(f"GPU {gpu.index} ({gpu.uuid}) is not offered: {why}")
            continue
        device.node = found.node if source is not None and os.path.exists(source) else ""
        search.offered.append(device)
    return search


def gpu_nodes(devices: Sequence[agent_pb2.Device]) -> dict[int, GpuNode]:
    """Host index -> GpuNode of the offered GPUs (from their Device.node)."""
    table = {}
    for device in devices:
        if device.kind != agent_pb2.DEVICE_KIND_GPU:
            continue
        minor = int(device.node.removeprefix(f"{SANDBOX_DEV_DIR}/nvidia")) if device.node else -1
        table[device.index] = GpuNode(device.index, device.uuid, minor)
    return table


def control_device_paths(driver: DriverPaths) -> list[tuple[Path, Path]]:
    """(on this machine, in the sandbox) of the NVIDIA control devices and dirs that exist here."""
    pairs = []
    for name in (*CONTROL_DEVICES, *CONTROL_DIRS):
        source = driver.dev_dir / name
        if os.path.exists(source):
            pairs.append((source, SANDBOX_DEV_DIR / name))
    return pairs
