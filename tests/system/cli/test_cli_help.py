"""Every command answers --help, and the top-level help documents the exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app

COMMANDS = ["server", "agent", "submit", "jobs", "agents", "status", "logs", "cancel", "metrics", "artifacts"]
COMMANDS += ["quickstart", "login", "logout", "whoami", "token", "agent-token", "remove-agent"]
COMMANDS += ["priority", "queue", "team", "quota"]
SUBCOMMANDS = [["token", name] for name in ("create", "list", "revoke")]
SUBCOMMANDS += [["agent-token", name] for name in ("create", "list", "revoke")]
SUBCOMMANDS += [["team", name] for name in ("list", "add", "remove")]
SUBCOMMANDS += [["quota", name] for name in ("set", "clear")]
SUBCOMMANDS += [["agent", name] for name in ("cordon", "uncordon", "drain")]

runner = CliRunner()


def test_top_level_help_lists_commands_and_exit_codes() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for command in COMMANDS:
        assert command in result.output
    assert "Exit codes" in result.output and "not found" in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=" ".join)
def test_subcommand_help(argv: list[str]) -> None:
    result = runner.invoke(app, [*argv, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


@pytest.mark.parametrize(
    ("group", "names"),
    [
        ("token", ("create", "list", "revoke")),
        ("agent-token", ("create", "list", "revoke")),
        ("team", ("list", "add", "remove")),
        ("quota", ("set", "clear")),
    ],
)
def test_command_groups_list_their_subcommands(group: str, names: tuple[str, ...]) -> None:
    result = runner.invoke(app, [group])
    assert all(name in result.output for name in names), result.output


def test_agent_help_lists_cordon_uncordon_and_drain() -> None:
    # `mwms agent` runs an agent; its subcommands act on one through the API.
    result = runner.invoke(app, ["agent", "--help"])
    assert result.exit_code == 0, result.output
    assert all(name in result.output for name in ("cordon", "uncordon", "drain", "--server")), result.output


def test_exit_codes_include_not_authorized() -> None:
    result = runner.invoke(app, ["--help"])
    assert "5 not logged in" in " ".join(result.output.split())


def test_help_does_not_import_the_server_or_tensorflow() -> None:
    code = "import sys; from mwms.cli.main import app; print(sorted(m for m in sys.modules if m.split('.')[0] in {'tensorflow', 'fastapi'} or m.startswith(('mwms.server', 'mwms.worker_agent'))))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_module_entry_point_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mwms.cli.main", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.startswith("mwms ")


def test_agent_rejects_bad_port_range_before_starting() -> None:
    result = runner.invoke(app, ["agent", "--port-range", "30000-20000"])
    assert result.exit_code == 2
    assert "must not be greater" in result.stderr


def test_agent_prints_a_systemd_unit_for_its_options():
    import subprocess
    import sys
    from pathlib import Path

    mwms = Path(sys.executable).parent / "mwms"
    out = subprocess.run(
        [
            str(mwms),
            "agent",
            "--server",
            "10.1.2.3:50051",
            "--name",
            "gpu 1",
            "--systemd-unit",
            "--user",
            "svc",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Restart=always" in out and "User=svc" in out
    assert '--server 10.1.2.3:50051 --name "gpu 1"' in out
