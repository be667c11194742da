"""`--log-format` and `--log-level` of `mwms server` and `mwms agent`: bad values are refused before
anything starts, naming the flag or variable, and the agent's systemd unit keeps the ones given."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app


@pytest.mark.parametrize(
    ("args", "env", "complaint"),
    [
        (["--log-format", "xml"], {}, "--log-format: Value error, log format 'xml' is not one of text, json"),
        ([], {"MWMS_LOG_LEVEL": "loud"}, "MWMS_LOG_LEVEL: Value error, log level 'loud' is not one of debug"),
    ],
)
def test_the_coordinator_refuses_a_bad_log_option(args, env, complaint, tmp_path, monkeypatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["server", "--data-dir", str(tmp_path / "data"), *args])
    assert result.exit_code == 2, result.output
    assert complaint in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())  # refused before anything started


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--log-format", "yaml"], "log format 'yaml' is not one of text, json"),
        (["--log-level", "trace"], "log level 'trace' is not one of debug, info, warning, error"),
    ],
)
def test_the_agent_refuses_a_bad_log_option(args, complaint, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["agent", "--work-dir", str(tmp_path / "work"), *args])
    assert result.exit_code == 2, result.output
    assert complaint in result.output and "give --log-format text|json" in result.output
    assert not list(tmp_path.iterdir())


def test_the_agents_systemd_unit_keeps_the_log_options_given(tmp_path: Path) -> None:
    given = CliRunner().invoke(
        app, ["agent", "--systemd-unit", "--log-format", "JSON", "--log-level", "Warning"]
    )
    assert given.exit_code == 0, given.output
    assert "--log-format json --log-level warning" in given.output

    plain = CliRunner().invoke(app, ["agent", "--systemd-unit"])
    assert plain.exit_code == 0, plain.output
    assert "--log-format" not in plain.output and "--log-level" not in plain.output
