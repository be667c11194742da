"""The systemd unit: restart policy, kill mode, quoting of the command line, and systemd's own verdict."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from worker_agent.systemd import UNIT_NAME, quote_argument, render_unit


def directives(unit: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in unit.splitlines() if "=" in line)


def test_the_unit_restarts_the_agent_and_lets_it_stop_its_tasks() -> None:
    unit = render_unit("/opt/mwms/bin/mwms", ["agent", "--server", "10.0.0.1:50051"], "mwms")
    values = directives(unit)
    assert values["ExecStart"] == "/opt/mwms/bin/mwms agent --server 10.0.0.1:50051"
    assert (values["Restart"], values["RestartSec"], values["KillMode"]) == ("always", "2", "mixed")
    assert values["User"] == "mwms"
    assert values["RestartPreventExitStatus"] == "2"  # refused by the coordinator: a restart cannot help
    assert values["StartLimitIntervalSec"] == "0"
    assert "User" not in directives(render_unit("/opt/mwms/bin/mwms", ["agent"], None))


def test_arguments_are_quoted_for_systemd() -> None:
    assert quote_argument("/var/lib/mwms") == "/var/lib/mwms"
    assert quote_argument("/var/lib/my agent") == '"/var/lib/my agent"'
    assert quote_argument("100%") == "100%%"
    assert quote_argument('a"b$HOME\\') == '"a\\"b$$HOME\\\\"'


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    unit = render_unit(sys.executable, ["-m", "mwms", "agent", "--work-dir", str(tmp_path / "my work")], None)
    path = tmp_path / UNIT_NAME
    path.write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
