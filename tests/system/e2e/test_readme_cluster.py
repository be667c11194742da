"""The README's local cluster, run as written: its three terminals' blocks, each in a shell of its own, in a
directory laid out like the repository (its .venv and examples/), then the program it submits.

Only what must differ between test runs is changed: the coordinator's ports (appended to `mwms server`,
replaced in the other terminals, and MWMS_API for the third, whose commands rely on the default address)
and the agent's work dir and port range. Terminals 1 and 2 do not return;
the test waits for what they say and stops them at the end, as Ctrl-C would.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mwms_testkit import REPO
from mwms_testkit.cluster import free_port
from mwms_testkit.parallel import task_ports

pytestmark = [pytest.mark.e2e, pytest.mark.tf]

ROOT = REPO
SECTION = "## A local cluster in three terminals"


def terminal_blocks() -> list[str]:
    """The bash blocks of the README's three-terminal section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def as_here(block: str, http: int, grpc: int, work: Path, ports: tuple[int, int]) -> str:
    """A block with this run's ports and paths (the only changes), the repository's venv activated."""
    block = block.replace("source .venv/bin/activate", f"source {ROOT}/.venv/bin/activate")
    block = re.sub(
        r"^(mwms server [^#\n]*?)(\s*#.*)?$", rf"\1 --http-port {http} --grpc-port {grpc}", block, flags=re.M
    )
    block = block.replace(":50051", f":{grpc}").replace(":8080", f":{http}")
    block = block.replace("/tmp/a1", str(work)).replace("21000-21099", f"{ports[0]}-{ports[1]}")
    return block


@pytest.fixture
def terminals(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
    for process in started:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_readmes_three_terminals_run_a_program(tmp_path: Path, terminals: list) -> None:
    blocks = terminal_blocks()
    assert len(blocks) == 3, blocks
    here = tmp_path / "repo"
    here.mkdir()
    for name in (".venv", "examples"):
        (here / name).symlink_to(ROOT / name)
    http, grpc, low = free_port(), free_port(), task_ports(23000 + os.getpid() % 250 * 10)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MWMS_", "TF_CONFIG", "VIRTUAL_ENV"))}
    env |= {"HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    scripts = [as_here(b, http, grpc, tmp_path / "a1", (low, low + 99)) for b in blocks]

    def open_terminal(number: int, script: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"terminal-{number}.log").open("wb")
        address = {"MWMS_API": f"http://127.0.0.1:{http}"} if number == 3 else {}
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=here,
            env=env | address,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        terminals.append(process)
        return process

    def said(number: int) -> str:
        return (tmp_path / f"terminal-{number}.log").read_text(errors="replace")

    server = open_terminal(1, scripts[0])
    deadline = time.monotonic() + 60
    while not (here / "mwms-data" / "admin-token").exists() or not _answers(http):
        assert server.poll() is None and time.monotonic() < deadline, said(1)
        time.sleep(0.2)
    assert (here / "join-token").stat().st_mode & 0o077 == 0  # "readable by you only"

    agent = open_terminal(2, scripts[1])
    while "connected to coordinator" not in said(2):  # a person opens terminal 3 once it has joined
        assert agent.poll() is None and time.monotonic() < deadline + 60, said(2)
        time.sleep(0.2)
    you = open_terminal(3, scripts[2])
    try:
        code = you.wait(timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail(f"terminal 3 did not finish:\n{said(3)}\n--- agent:\n{said(2)}")
    assert code == 0, f"{said(3)}\n--- server:\n{said(1)[-3000:]}\n--- agent:\n{said(2)[-3000:]}"
    assert agent.poll() is None and server.poll() is None  # they do not return
    output = said(3)
    assert "cpu-1" in output, output  # `mwms agents`
    assert "FINAL loss=" in output and "SUCCEEDED" in output, output


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
