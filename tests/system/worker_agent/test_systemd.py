"""The systemd unit: restart policy, kill mode, the join token's file, quoting of the command line, and
systemd's own verdict."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mwms.worker_agent.systemd import AGENT_ENV_FILE, UNIT_NAME, quote_argument, render_unit


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


def test_the_join_token_comes_from_a_root_only_file_and_the_agent_keeps_its_files_to_itself() -> None:
    unit = render_unit("/opt/mwms/bin/mwms", ["agent", "--server", "10.0.0.1:50051"], None)
    values = directives(unit)
    assert AGENT_ENV_FILE == "/etc/mwms/agent.env"
    assert values["EnvironmentFile"] == "-/etc/mwms/agent.env"  # optional: a joined agent has its credential
    assert values["UMask"] == "0077"
    assert "MWMS_JOIN_TOKEN" not in values["ExecStart"] and "--join-token" not in values["ExecStart"]
    assert "apt-get install bubblewrap" in unit
    # Hardening that would stop bwrap and setpriv from switching users and making namespaces stays off.
    for blocked in ("NoNewPrivileges", "ProtectSystem", "RestrictNamespaces", "SystemCallFilter"):
        assert blocked not in values


def test_arguments_are_quoted_for_systemd() -> None:
    assert quote_argument("/var/lib/mwms") == "/var/lib/mwms"
    assert quote_argument("/var/lib/my agent") == '"/var/lib/my agent"'
    assert quote_argument("100%") == "100%%"
    assert quote_argument('a"b$HOME\\') == '"a\\"b$$HOME\\\\"'


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    args = ["-m", "mwms", "agent", "--work-dir", str(tmp_path / "my work")]
    args += ["--join-token-file", str(tmp_path / "join token")]
    unit = render_unit(sys.executable, args, "root")
    path = tmp_path / UNIT_NAME
    path.write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_printed_unit_names_the_join_token_file_but_never_a_token(tmp_path: Path) -> None:
    token_file = tmp_path / "join-token"  # need not exist or be readable where the unit is made
    command = [sys.executable, "-m", "mwms.cli.main", "agent", "--systemd-unit"]
    command += ["--join-token-file", str(token_file)]
    env = {"PATH": "/usr/bin:/bin", "MWMS_JOIN_TOKEN": "token-that-must-stay-out"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert result.returncode == 0, result.stderr
    values = directives(result.stdout)
    assert values["ExecStart"].endswith(f"--join-token-file {token_file}")
    assert "token-that-must-stay-out" not in result.stdout
