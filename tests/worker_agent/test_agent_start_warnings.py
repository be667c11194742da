"""What an agent says at start about slips in how it was started: no GPU found where the README's GPU line
was used (the reason, and that it offers CPU slots instead), and a task port range inside the kernel's
ephemeral range (with a range to use instead). The agents are real `mwms agent` processes pointed at a port
nothing listens on; the GPUs are `nvidia-smi` scripts first on PATH, as in tests/fake_gpus.py."""

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


def agent_start_log(tmp_path: Path, path: str, *args: str, until: str = "coordinator") -> str:
    """The agent's stderr up to its first attempt to register (`until` seen), then it is stopped."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    env = {**clean, "PATH": path, "MWMS_JOIN_TOKEN": "start-warnings-test-join-token"}
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
    said = agent_start_log(tmp_path, tools_with(tmp_path, ONE_GPU_SMI), "--slots", "4")
    assert "found 1 GPU(s); --slots 4 is ignored" in said
    assert "offering 1 GPU(s): Stand-in GPU" in said


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
