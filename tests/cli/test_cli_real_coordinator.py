"""The CLI's error handling against the real coordinator, started as a process with `mwms server`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from mwms.cli.main import app
from mwms.cli.processes import free_port

pytestmark = pytest.mark.e2e

runner = CliRunner()


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("coordinator")
    http_port, grpc_port = free_port(), free_port()
    argv = [sys.executable, "-m", "mwms.cli.main", "server", "--http-port", str(http_port)]
    argv += ["--grpc-port", str(grpc_port), "--data-dir", str(data_dir)]
    log = (data_dir / "server.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{api}/healthz", timeout=1).is_success:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            pytest.fail(f"coordinator did not start: {(data_dir / 'server.log').read_text()[-2000:]}")
        yield api
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_unknown_job_exits_4(coordinator: str) -> None:
    result = runner.invoke(app, ["status", "nosuchjob", "--api", coordinator])
    assert result.exit_code == 4
    assert "nosuchjob" in result.stderr


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
