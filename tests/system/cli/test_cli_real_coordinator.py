"""The CLI against the real coordinator, started as a process with `mwms server`: error handling, and tokens
end to end (the first admin token from <data dir>/admin-token, users and viewers, revocation)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from mwms.cli.errors import ExitCode, exit_code_for, message_for
from mwms.cli.main import app
from mwms.client import Client
from mwms.connection import load_config
from mwms.errors import NotFound
from mwms_testkit.cluster import read_ports_file, wait_until

pytestmark = pytest.mark.e2e

runner = CliRunner()


@pytest.fixture(scope="module")
def coordinator_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A coordinator on ports it picked (port 0); yields its API address and data dir (with the first
    admin token)."""
    data_dir = tmp_path_factory.mktemp("coordinator")
    ports_file = data_dir / "ports.json"
    argv = [sys.executable, "-m", "mwms.cli.main", "server", "--http-port", "0", "--grpc-port", "0"]
    argv += ["--data-dir", str(data_dir), "--ports-file", str(ports_file)]
    log = (data_dir / "server.log").open("wb")
    env = {key: value for key, value in os.environ.items() if not key.startswith("MWMS_")}
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:

        def healthy_api() -> str | None:
            if process.poll() is not None:
                pytest.fail(f"coordinator exited: {(data_dir / 'server.log').read_text()[-2000:]}")
            ports = read_ports_file(ports_file)
            if ports is None:
                return None
            api = f"http://127.0.0.1:{ports['http']}"
            try:
                return api if httpx.get(f"{api}/healthz", timeout=1).is_success else None
            except httpx.TransportError:
                return None

        server_log = (data_dir / "server.log").read_text
        api = wait_until(healthy_api, 60, "the coordinator to start", observed=lambda: server_log()[-2000:])
        yield api, data_dir
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


@pytest.fixture
def admin_token(coordinator_process: tuple[str, Path]) -> str:
    """The admin token the coordinator wrote on its first start."""
    return (coordinator_process[1] / "admin-token").read_text().strip()


@pytest.fixture
def coordinator(
    coordinator_process: tuple[str, Path], admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """The coordinator's API address; commands send the admin token (MWMS_TOKEN)."""
    monkeypatch.setenv("MWMS_TOKEN", admin_token)
    return coordinator_process[0]


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_unknown_job_exits_4(coordinator: str) -> None:
    result = runner.invoke(app, ["status", "nosuchjob", "--api", coordinator])
    assert result.exit_code == 4
    assert "nosuchjob" in result.stderr


def test_an_unknown_bundle_digest_is_not_found_and_says_to_upload(coordinator: str, admin_token: str) -> None:
    # The coordinator answers 404, as for every unknown resource: the client raises NotFound, the CLI
    # exits 4 with the coordinator's advice.
    spec = {"bundle_digest": "0" * 64, "command": ["python", "t.py"], "workers": 1}
    with pytest.raises(NotFound) as refused:
        Client(coordinator, admin_token).create_job(spec)
    assert refused.value.status == 404
    assert "upload the program with POST /api/v1/bundles" in refused.value.detail
    assert exit_code_for(refused.value) == ExitCode.NOT_FOUND
    assert message_for(refused.value, coordinator).startswith(f"not found: unknown bundle digest {'0' * 64}")


def test_rejected_env_exits_2_with_the_reason(coordinator: str, program: Path) -> None:
    argv = [
        "submit",
        str(program),
        "-n",
        "1",
        "-e",
        "TF_CONFIG={}",
        "--api",
        coordinator,
        "--",
        "python",
        "t.py",
    ]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert "TF_CONFIG" in result.stderr and "cannot be overridden" in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "Traceback" not in result.output


def test_bad_state_filter_exits_2(coordinator: str) -> None:
    result = runner.invoke(app, ["jobs", "--state", "BOGUS", "--api", coordinator])
    assert result.exit_code == 2
    assert "state" in result.stderr


def test_submit_then_read_and_cancel(coordinator: str, program: Path) -> None:
    # No agents: the job stays PENDING, which is enough to read it back and cancel it.
    submitted = runner.invoke(
        app, ["submit", str(program), "-n", "2", "--api", coordinator, "--", "python", "t.py"]
    )
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.splitlines()[0]
    status = json.loads(runner.invoke(app, ["status", job_id, "--json", "--api", coordinator]).stdout)
    assert status["state"] == "PENDING" and status["workers"] == 2 and status["name"] == program.name
    listed = json.loads(
        runner.invoke(app, ["jobs", "--json", "--state", "pending", "--api", coordinator]).stdout
    )
    assert job_id in [job["id"] for job in listed["jobs"]]
    cancelled = runner.invoke(app, ["cancel", job_id, "--api", coordinator])
    assert cancelled.exit_code == 0 and "CANCELLED" in cancelled.stdout
    logs = runner.invoke(app, ["logs", job_id, "--follow", "--api", coordinator])
    assert logs.exit_code == 0  # the stream ends because the job has ended
    again = runner.invoke(app, ["cancel", job_id, "--api", coordinator])
    assert again.exit_code == 2, again.output


# -- tokens end to end -------------------------------------------------------------------------------------


def _token(api: str, user: str, role: str) -> tuple[str, str]:
    """Creates a token as the admin (MWMS_TOKEN); returns (id, secret)."""
    created = runner.invoke(app, ["token", "create", "--user", user, "--role", role, "--json", "--api", api])
    assert created.exit_code == 0, created.output
    body = json.loads(created.stdout)
    return body["id"], body["token"]


def test_without_a_token_the_cli_says_where_the_first_one_is(
    coordinator_process: tuple[str, Path], admin_token: str
) -> None:
    api, data_dir = coordinator_process
    result = runner.invoke(app, ["jobs", "--api", api])
    assert result.exit_code == 5
    assert "mwms login" in result.stderr and "admin-token" in result.stderr
    assert stat.S_IMODE((data_dir / "admin-token").stat().st_mode) == 0o600


def test_login_with_the_first_admin_token_file(
    coordinator_process: tuple[str, Path], admin_token: str, private_config: Path
) -> None:
    api, data_dir = coordinator_process
    result = runner.invoke(app, ["login", "--api", api, "--token-file", str(data_dir / "admin-token")])
    assert result.exit_code == 0, result.output
    assert "as admin (admin)" in result.stdout and admin_token not in result.output
    assert stat.S_IMODE(private_config.stat().st_mode) == 0o600
    saved = load_config(private_config)
    assert saved is not None and (saved.api, saved.token) == (api, admin_token)
    whoami = runner.invoke(app, ["whoami", "--json"])  # no --api, no MWMS_TOKEN: the config file
    assert whoami.exit_code == 0 and json.loads(whoami.stdout)["role"] == "admin"
    assert runner.invoke(app, ["logout"]).exit_code == 0
    assert runner.invoke(app, ["jobs"]).exit_code == 5


def test_users_viewers_and_revocation(coordinator: str, program: Path) -> None:
    api = coordinator
    user_id, user_secret = _token(api, "uma", "user")
    _, viewer_secret = _token(api, "vic", "viewer")
    listed = runner.invoke(app, ["token", "list", "--api", api])
    assert listed.exit_code == 0 and "uma" in listed.stdout and "vic" in listed.stdout
    assert user_secret not in listed.output and viewer_secret not in listed.output

    as_viewer = ["--api", api, "--token", viewer_secret]
    as_user = ["--api", api, "--token", user_secret]
    refused = runner.invoke(app, ["submit", str(program), "-n", "1", *as_viewer, "--", "python", "t.py"])
    assert refused.exit_code == 5, refused.output
    assert "not allowed" in refused.stderr and "viewer" in refused.stderr
    assert viewer_secret not in refused.output

    submitted = runner.invoke(app, ["submit", str(program), "-n", "1", *as_user, "--", "python", "t.py"])
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.splitlines()[0]
    jobs = runner.invoke(app, ["jobs", *as_viewer])  # a viewer may read
    assert jobs.exit_code == 0 and "SUBMITTED BY" in jobs.stdout
    assert any(job_id in line and "uma" in line for line in jobs.stdout.splitlines()), jobs.stdout
    assert (
        json.loads(runner.invoke(app, ["status", job_id, "--json", *as_viewer]).stdout)["submitted_by"]
        == "uma"
    )

    not_cancelled = runner.invoke(app, ["cancel", job_id, *as_viewer])
    assert not_cancelled.exit_code == 5 and "not allowed" in not_cancelled.stderr
    cancelled = runner.invoke(app, ["cancel", job_id, *as_user])
    assert cancelled.exit_code == 0, cancelled.output
    status = runner.invoke(app, ["status", job_id, *as_user])
    assert "cancelled by" in status.stdout and "uma" in status.stdout

    assert runner.invoke(app, ["token", "create", "--user", "x", *as_user]).exit_code == 5
    revoked = runner.invoke(app, ["token", "revoke", user_id, "--api", api])
    assert revoked.exit_code == 0 and user_id in revoked.stdout
    after = runner.invoke(app, ["whoami", *as_user])
    assert after.exit_code == 5 and "refused the token from --token" in after.stderr
    assert user_secret not in after.output


def test_agent_tokens_and_remove_agent(coordinator: str) -> None:
    created = runner.invoke(
        app, ["agent-token", "create", "--name", "rack-7", "--expires-in", "1d", "--api", coordinator]
    )
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip()
    assert secret and "shown only this once" in created.stderr
    listed = runner.invoke(app, ["agent-token", "list", "--json", "--api", coordinator])
    ours = [item for item in json.loads(listed.stdout) if item["name"] == "rack-7"]
    assert len(ours) == 1 and ours[0]["expires_at"] and "token" not in ours[0]
    revoked = runner.invoke(app, ["agent-token", "revoke", ours[0]["id"], "--api", coordinator])
    assert revoked.exit_code == 0, revoked.output
    missing = runner.invoke(app, ["remove-agent", "no-such-agent", "--api", coordinator])
    assert missing.exit_code == 4 and "mwms agents" in missing.stderr
