"""--env pairs, --port-range values and exit-code mapping."""

from __future__ import annotations

import pytest

from mwms.cli.errors import CliError, ExitCode, exit_code_for, message_for
from mwms.cli.parsing import parse_env, parse_port_range
from mwms.client.job_spec import build_job_spec
from mwms.errors import CoordinatorUnreachable, InvalidSpec, error_for_status


def test_env_pairs() -> None:
    assert parse_env(["A=1", "B=x=y", "EMPTY="]) == {"A": "1", "B": "x=y", "EMPTY": ""}
    assert parse_env([]) == {}


@pytest.mark.parametrize("pair", ["NOEQUALS", "=value", " =v"])
def test_bad_env_pairs(pair: str) -> None:
    with pytest.raises(CliError) as raised:
        parse_env([pair])
    assert raised.value.code == ExitCode.USAGE
    assert "NAME=VALUE" in raised.value.message


def test_port_range() -> None:
    assert parse_port_range("20000-20999") == (20000, 20999)
    assert parse_port_range("1024-1024") == (1024, 1024)
    assert parse_port_range("65535-65535") == (65535, 65535)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("20000", "LO-HI"),
        ("a-b", "LO-HI"),
        ("20000-", "LO-HI"),
        ("1023-2000", "between 1024 and 65535"),
        ("20000-70000", "between 1024 and 65535"),
        ("21000-20000", "must not be greater"),
    ],
)
def test_bad_port_range(text: str, complaint: str) -> None:
    with pytest.raises(CliError, match=complaint):
        parse_port_range(text)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (None, ExitCode.UNREACHABLE),
        (500, ExitCode.UNREACHABLE),
        (503, ExitCode.UNREACHABLE),
        (404, ExitCode.NOT_FOUND),
        (400, ExitCode.USAGE),
        (409, ExitCode.USAGE),
        (422, ExitCode.USAGE),
    ],
)
def test_exit_code_mapping(status: int | None, code: ExitCode) -> None:
    error = CoordinatorUnreachable("x") if status is None else error_for_status(status, "x")
    assert exit_code_for(error) == code


def test_errors_found_locally_exit_2_with_their_own_message() -> None:
    error = InvalidSpec("/nope does not exist; pass the directory that holds your training program")
    assert exit_code_for(error) == ExitCode.USAGE
    assert message_for(error, "http://127.0.0.1:9") == error.detail


def test_unreachable_message_says_where_and_what_to_do() -> None:
    message = message_for(CoordinatorUnreachable("ConnectError: refused"), "http://127.0.0.1:9")
    assert "http://127.0.0.1:9" in message and "mwms server" in message


def test_job_spec_leaves_out_what_was_not_set() -> None:
    spec = build_job_spec(name="n", bundle_digest="d" * 64, command=["python", "t.py"], workers=2)
    assert spec == {"name": "n", "bundle_digest": "d" * 64, "command": ["python", "t.py"], "workers": 2}


def test_job_spec_with_everything() -> None:
    spec = build_job_spec(
        name="n",
        bundle_digest="d" * 64,
        command=["python"],
        workers=1,
        gpus_per_worker=2,
        env={"A": "1"},
        communication="NCCL",
        collective_timeout=30.0,
        bytes_per_pack=0,
        max_restarts=0,
        restart_on="any",
        fail_on_nan=["loss", "val_loss"],
        startup_timeout=60.0,
        max_runtime=3600.0,
    )
    assert spec["communication"] == {"implementation": "NCCL", "timeout_seconds": 30.0, "bytes_per_pack": 0}
    assert spec["restart"] == {"max_restarts": 0, "restart_on": "any", "fail_on_nan": ["loss", "val_loss"]}
    assert spec["gpus_per_worker"] == 2 and spec["env"] == {"A": "1"}
    assert spec["startup_timeout_seconds"] == 60.0 and spec["max_runtime_seconds"] == 3600.0


def test_task_uid_ranges_are_unprivileged_and_ordered() -> None:
    from mwms.cli.parsing import parse_uid_range

    assert parse_uid_range("60000-60999") == (60000, 60999)
    for bad, says in (("60000", "LO-HI"), ("0-10", "uid 0 is root"), ("10-5", "LO <= HI"), ("a-b", "LO-HI")):
        with pytest.raises(CliError, match=says):
            parse_uid_range(bad)


@pytest.mark.parametrize(
    ("args", "env", "complaint"),
    [
        (
            ["--serve", "everything"],
            {},
            "--serve: Input should be 'api', 'agents' or 'both' (got 'everything')",
        ),
        ([], {"MWMS_AGENT_TIMEOUT_S": "soon"}, "MWMS_AGENT_TIMEOUT_S: Input should be a valid number"),
    ],
)
def test_a_bad_coordinator_setting_names_its_flag_or_variable(
    args, env, complaint, tmp_path, monkeypatch
) -> None:
    from typer.testing import CliRunner

    from mwms.cli.main import app

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["server", "--data-dir", str(tmp_path), *args])
    assert result.exit_code == 2
    assert complaint in result.output and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())  # refused before anything started
