"""Which GPUs a task is told and sees: the node of each GPU found by its minor number, the variables that
name a task's GPUs, and the sandbox that binds exactly their nodes (stand-in driver files of
testkit/mwms_testkit/fake_gpus.py: GPU 0 is /dev/nvidia1, GPU 1 is /dev/nvidia0; real bwrap, as root in CI)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from mwms.v1 import agent_pb2
from mwms.worker_agent.gpu_nodes import DriverPaths, GpuNode, gpu_nodes, locate_nodes, read_minor_numbers
from mwms.worker_agent.sandbox import Confinement, find_bwrap
from mwms.worker_agent.seccomp import run_filled
from mwms.worker_agent.task_env import TaskPaths, child_environment, gpu_variables
from mwms.worker_agent.task_users import TaskUsers
from mwms_testkit.fake_gpus import BUS_IDS, MINORS, UUIDS, write_stand_in_driver
from mwms_testkit.parallel import free_uid_range

ROOT = os.geteuid() == 0
needs_sandbox = pytest.mark.skipif(
    not ROOT or shutil.which("bwrap") is None, reason="a sandbox as another uid needs root and bubblewrap"
)


def gpus(count: int = 2) -> list[agent_pb2.Device]:
    return [
        agent_pb2.Device(kind=agent_pb2.DEVICE_KIND_GPU, index=i, name="Stand-in GPU", uuid=UUIDS[i])
        for i in range(count)
    ]


def driver_in(tmp_path: Path) -> DriverPaths:
    return DriverPaths.from_environment(write_stand_in_driver(tmp_path / "driver"))


def test_minor_numbers_come_from_the_drivers_files_not_from_the_index(tmp_path: Path) -> None:
    driver = driver_in(tmp_path)
    assert read_minor_numbers(driver.proc_dir) == {UUIDS[0].lower(): MINORS[0], UUIDS[1].lower(): MINORS[1]}
    search = locate_nodes(gpus(), driver, need_nodes=True)
    assert [(d.index, d.uuid, d.node) for d in search.offered] == [
        (0, UUIDS[0], f"/dev/nvidia{MINORS[0]}"),
        (1, UUIDS[1], f"/dev/nvidia{MINORS[1]}"),
    ]
    assert search.left_out == []
    table = gpu_nodes(search.offered)
    assert table[0] == GpuNode(0, UUIDS[0], MINORS[0])
    assert table[0].source(driver) == driver.dev_dir / f"nvidia{MINORS[0]}"


def test_a_gpu_without_a_node_is_left_out_of_a_sandbox_with_the_reason(tmp_path: Path) -> None:
    driver = driver_in(tmp_path)
    (driver.dev_dir / f"nvidia{MINORS[1]}").unlink()
    (driver.proc_dir / BUS_IDS[0] / "information").write_text("GPU UUID: \t GPU-someone-else\n")
    search = locate_nodes(gpus(), driver, need_nodes=True)
    assert search.offered == []
    assert [line.split(": ", 1)[0] for line in search.left_out] == [
        f"GPU 0 ({UUIDS[0]}) is not offered",
        f"GPU 1 ({UUIDS[1]}) is not offered",
    ]
    assert "its minor number is unknown" in search.left_out[0]
    assert f"nvidia{MINORS[1]} does not exist" in search.left_out[1]
    # Without a sandbox nothing is bound: both are offered, the one with a known node says it.
    loose = locate_nodes(gpus(), driver, need_nodes=False)
    assert [(d.index, d.node) for d in loose.offered] == [(0, ""), (1, "")]


def test_a_malformed_or_huge_information_file_is_ignored(tmp_path: Path) -> None:
    driver = driver_in(tmp_path)
    (driver.proc_dir / BUS_IDS[0] / "information").write_text("Device Minor: many\n" + "x" * 200_000)
    assert read_minor_numbers(driver.proc_dir) == {UUIDS[1].lower(): MINORS[1]}
    assert read_minor_numbers(tmp_path / "no-such-dir") == {}


def start(**fields: object) -> agent_pb2.StartTask:
    defaults: dict[str, object] = {"task_id": "t-1", "job_id": "j-1", "attempt": 1, "task_index": 1}
    defaults.update(fields)
    return agent_pb2.StartTask(**defaults)  # type: ignore[arg-type]


def test_a_task_is_told_its_gpus_by_uuid_inside_a_sandbox_and_outside_it() -> None:
    task = start(device_kind=agent_pb2.DEVICE_KIND_GPU, device_indices=[1])
    given = [GpuNode(1, UUIDS[1], MINORS[1])]
    for sandboxed in (True, False):
        told = gpu_variables(task, given, sandboxed)
        assert told == {
            "CUDA_VISIBLE_DEVICES": UUIDS[1],
            "MWMS_GPU_UUIDS": UUIDS[1],
            "MWMS_NUM_GPUS": "1",
        }
    both = start(device_kind=agent_pb2.DEVICE_KIND_GPU, device_indices=[1, 0])
    told = gpu_variables(both, [GpuNode(1, UUIDS[1]), GpuNode(0, UUIDS[0])], True)
    assert told["CUDA_VISIBLE_DEVICES"] == told["MWMS_GPU_UUIDS"] == f"{UUIDS[1]},{UUIDS[0]}"


def test_without_uuids_a_sandboxed_task_gets_ordinals_and_an_unsandboxed_one_host_indices() -> None:
    task = start(device_kind=agent_pb2.DEVICE_KIND_GPU, device_indices=[2, 3])
    assert gpu_variables(task, [], True)["CUDA_VISIBLE_DEVICES"] == "0,1"
    loose = gpu_variables(task, [], False)
    assert loose["CUDA_VISIBLE_DEVICES"] == "2,3" and loose["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    cpu = gpu_variables(start(device_kind=agent_pb2.DEVICE_KIND_CPU_SLOT, device_indices=[0]), [], True)
    assert cpu == {"CUDA_VISIBLE_DEVICES": "", "MWMS_GPU_UUIDS": "", "MWMS_NUM_GPUS": "0"}


def test_a_task_inherits_none_of_the_agents_gpu_variables_but_keeps_the_jobs_and_the_library_path(
    tmp_path: Path,
) -> None:
    task = start(
        device_kind=agent_pb2.DEVICE_KIND_GPU,
        device_indices=[0],
        env={"CUDA_LAUNCH_BLOCKING": "1", "NVIDIA_TF32_OVERRIDE": "0"},
    )
    agent_env = {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/usr/lib/nvidia",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps",
    }
    env = child_environment(
        task, TaskPaths.for_task(tmp_path, task), agent_env, gpus=[GpuNode(0, UUIDS[0], 1)], sandboxed=True
    )
    assert env["CUDA_VISIBLE_DEVICES"] == UUIDS[0]
    assert env["LD_LIBRARY_PATH"] == "/usr/lib/nvidia"
    assert env["CUDA_LAUNCH_BLOCKING"] == "1" and env["NVIDIA_TF32_OVERRIDE"] == "0"  # the job's own
    for name in (
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "CUDA_DEVICE_ORDER",
        "CUDA_MPS_PIPE_DIRECTORY",
    ):
        assert name not in env


@needs_sandbox
def test_a_sandbox_binds_exactly_its_gpus_nodes_found_by_minor_number(tmp_path: Path) -> None:
    driver = driver_in(tmp_path)
    work_dir = tmp_path / "agent"
    work_dir.mkdir(mode=0o700)
    users = TaskUsers(None, free_uid_range(1), lock_dir=tmp_path / "task-uids")
    confinement = Confinement(work_dir, users, find_bwrap("bwrap"), driver)
    paths = TaskPaths.for_task(work_dir, start())
    paths.create_fresh()
    identity = users.acquire("t-1", "j-1")
    paths.hand_over(identity.uid, identity.gid)
    given = [GpuNode(1, UUIDS[1], MINORS[1])]  # GPU 1, whose node is /dev/nvidia0 here
    listing = "import os; print(sorted(n for n in os.listdir('/dev') if n.startswith('nvidia')))"
    launch = confinement.launch([sys.executable, "-c", listing], paths, identity, given)
    done = run_filled(launch.argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted([f"nvidia{MINORS[1]}", "nvidia-uvm", "nvidiactl"]))
    # A CPU task gets no GPU node and no control device.
    cpu = confinement.launch([sys.executable, "-c", listing], paths, identity, [])
    assert run_filled(cpu.argv, capture_output=True, text=True, timeout=60).stdout.strip() == "[]"
