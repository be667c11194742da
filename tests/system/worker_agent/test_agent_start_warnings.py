"""What an agent says at start about slips in how it was started: no GPU found where the README's GPU line
was used (the reason, and that it offers CPU slots instead), and a task port range inside the kernel's
ephemeral range (with a range to use instead). The agents are real `mwms agent` processes pointed at a port
nothing listens on; the GPUs are `nvidia-smi` scripts first on PATH, as in testkit/mwms_testkit/fake_gpus.py."""

from __future__ import annotations

import os
import selectors
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from mwms import agent_defaults
from mwms.worker_agent.config import ephemeral_overlap_warning, ephemeral_range
from mwms_testkit.fake_gpus import FAKE_NVIDIA_SMI, MINORS, UUIDS, write_stand_in_driver

NOWHERE = "127.0.0.1:9"
BROKEN_DRIVER_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
exit 9
"""
ONE_GPU_SMI = """#!/bin/sh
printf '0, Stand-in GPU, GPU-00000000-0000-0000-0000-000000000000, 81920\\n'
"""


def tools_with(tmp_path: Path, nvidia_smi: str | None) -> str:
    """A PATH with the venv's python and, when given, this nvidia-smi script, and nothing else."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        smi = tools / "nvidia-smi"
        smi.write_text(nvidia_smi)
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return f"{tools}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin"


def agent_start_log(
    tmp_path: Path, path: str, *args: str, until: str = "coordinator", env: dict[str, str] | None = None
) -> str:
    """The agent's stderr up to its first attempt to register (`until` seen), then it is stopped."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    env = {**clean, "PATH": path, "MWMS_JOIN_TOKEN": "start-warnings-test-join-token", **(env or {})}
    command = [sys.executable, "-m", "mwms.cli.main", "agent", "--server", NOWHERE, "--name", "a"]
    command += ["--work-dir", str(tmp_path / "work"), *args]
    agent = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert agent.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 60
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(agent.stderr, selectors.EVENT_READ)
            while time.monotonic() < deadline and agent.poll() is None:
                if selector.select(timeout=0.5):
                    line = agent.stderr.readline()
                    seen.append(line)
                    if "cannot register" in line:
                        return "".join(seen)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    raise AssertionError(f"the agent never tried to register; it said:\n{''.join(seen)}")


def test_an_agent_without_nvidia_smi_says_it_found_no_gpu_and_offers_a_cpu_slot(tmp_path: Path) -> None:
    said = agent_start_log(tmp_path, tools_with(tmp_path, None))
    assert (
        "WARNING" in said
        and "no GPU found (nvidia-smi is not on PATH: is the NVIDIA driver installed?)" in said
    )
    assert "this agent offers 1 CPU slot instead" in said
    assert "pass --slots N to offer N CPU slots on purpose" in said


def test_a_driver_that_does_not_answer_is_named_in_the_warning(tmp_path: Path) -> None:
    said = agent_start_log(tmp_path, tools_with(tmp_path, BROKEN_DRIVER_SMI))
    assert (
        "no GPU found (nvidia-smi exited with 9: NVIDIA-SMI has failed because it couldn't communicate"
        in said
    )


def test_cpu_slots_asked_for_with_slots_bring_no_warning(tmp_path: Path) -> None:
    said = agent_start_log(tmp_path, tools_with(tmp_path, BROKEN_DRIVER_SMI), "--slots", "2")
    assert "offering 2 CPU slots as --slots asks" in said
    assert "no GPU found (nvidia-smi exited with 9" in said  # said, at INFO
    assert "this agent offers" not in said


def test_slots_beside_gpus_are_said_to_be_ignored(tmp_path: Path) -> None:
    driver = write_stand_in_driver(tmp_path / "driver")
    said = agent_start_log(tmp_path, tools_with(tmp_path, FAKE_NVIDIA_SMI), "--slots", "4", env=driver)
    assert "found 2 GPU(s); --slots 4 is ignored" in said
    assert "offering 2 GPU(s): Stand-in GPU, Stand-in GPU" in said


def test_a_gpu_whose_node_is_missing_is_not_offered_and_the_agent_says_why(tmp_path: Path) -> None:
    driver = write_stand_in_driver(tmp_path / "driver")
    (Path(driver["MWMS_NVIDIA_DEV_DIR"]) / f"nvidia{MINORS[1]}").unlink()
    said = agent_start_log(tmp_path, tools_with(tmp_path, FAKE_NVIDIA_SMI), "--sandbox", "bwrap", env=driver)
    assert f"GPU 1 ({UUIDS[1]}) is not offered: its device node" in said
    assert f"nvidia{MINORS[1]} does not exist (minor number {MINORS[1]})" in said
    assert "sandbox checked: a task given GPU 0 (/dev/nvidia1) sees exactly that GPU" in said
    assert "offering 1 GPU(s): Stand-in GPU" in said


def test_a_gpu_without_a_minor_number_is_not_offered_by_a_sandboxed_agent(tmp_path: Path) -> None:
    # No driver files at all (a host whose /proc/driver/nvidia is hidden): nvidia-smi's GPU 0 would be
    # assumed to be /dev/nvidia0, which on this stand-in machine is GPU 1's.
    said = agent_start_log(tmp_path, tools_with(tmp_path, ONE_GPU_SMI), "--sandbox", "bwrap")
    assert f"GPU 0 ({UUIDS[0]}) is not offered: its minor number is unknown" in said
    assert "no GPU found (GPU 0" in said and "this agent offers 1 CPU slot instead" in said


def test_a_sandbox_that_shows_a_task_no_gpu_leaves_the_gpu_out(tmp_path: Path) -> None:
    # A driver that needs more than the sandbox binds: `nvidia-smi -L` inside lists nothing.
    blind = FAKE_NVIDIA_SMI.replace(
        'if [ "$1" = "-L" ]; then',
        'if [ "$1" = "-L" ]; then echo "No devices found."; exit 6; fi\nif false; then',
    )
    driver = write_stand_in_driver(tmp_path / "driver")
    said = agent_start_log(tmp_path, tools_with(tmp_path, blind), "--sandbox", "bwrap", env=driver)
    assert (
        f"GPU 0 ({UUIDS[0]}) is not offered: a sandboxed task given it (node /dev/nvidia{MINORS[0]}) sees no GPU"
        in said
    )
    assert "No devices found." in said
    assert "this agent offers 1 CPU slot instead" in said


def test_a_port_range_inside_the_ephemeral_range_gets_a_warning_with_one_to_use(tmp_path: Path) -> None:
    ephemeral = ephemeral_range()
    assert ephemeral is not None, "these tests run on Linux"
    low = ephemeral[0] + 100
    said = agent_start_log(tmp_path, tools_with(tmp_path, None), "--port-range", f"{low}-{low + 99}")
    expected = ephemeral_overlap_warning(low, low + 99, ephemeral)
    assert f"the task port range {low}-{low + 99} lies inside this machine's ephemeral port range" in said
    assert expected.split(";")[0] in said
    default = agent_start_log(tmp_path, tools_with(tmp_path, None))
    assert "ephemeral port range" not in default  # 20000-20999 lies below Linux's usual 32768-60999


def test_the_range_to_use_instead_lies_outside_the_ephemeral_range() -> None:
    linux = (32768, 60999)
    assert ephemeral_overlap_warning(20000, 20999, linux) == ""
    assert ephemeral_overlap_warning(61000, 61099, linux) == ""
    text = ephemeral_overlap_warning(40000, 40099, linux)
    assert "the task port range 40000-40099 lies inside" in text and "32768-60999" in text
    assert "100 of its ports may be taken" in text
    assert f"pass --port-range {agent_defaults.PORT_LOW}-{agent_defaults.PORT_LOW + 99} instead" in text
    # Straddling the edge: only the ports inside count.
    assert "10 of its ports" in ephemeral_overlap_warning(60990, 61009, linux)
    # Larger than the default range: the same size just below the ephemeral range.
    wide = ephemeral_overlap_warning(30000, 34999, linux)
    assert "pass --port-range 20000-24999 instead" in wide
    # Reserved ports (net.ipv4.ip_local_reserved_ports) are never handed out: no clash.
    assert ephemeral_overlap_warning(40000, 40009, linux, set(range(40000, 40010))) == ""
    # An ephemeral range that starts low leaves room only above it.
    assert "pass --port-range 61000-61099 instead" in ephemeral_overlap_warning(2000, 2099, (1100, 60999))
