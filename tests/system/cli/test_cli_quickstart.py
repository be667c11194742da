"""`mwms quickstart` end to end: real coordinator and agent processes on free ports."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

FAILING_PROGRAM = """\
import json, os, sys
index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
print(f"worker {index} starting", flush=True)
if index == 1:
    print("something broke in worker 1", file=sys.stderr, flush=True)
    sys.exit(3)
"""


def _processes_mentioning(text: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", text], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if "pgrep" not in line]


def _run_quickstart(
    data_dir: Path, example: Path | None, *args: str, warm_pool: bool = False
) -> subprocess.CompletedProcess[str]:
    """Runs `mwms quickstart` (with `example` for the Keras one); its agents keep no warm interpreter, as
    everywhere in the suite (tests/conftest.py), unless `warm_pool` (then the agents' own default)."""
    patch = f"q.example_dir = lambda: Path({str(example)!r})" if example else ""
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        import mwms.cli.quickstart as q
        {patch}
        from mwms.cli.main import app
        app(["quickstart", "--data-dir", {str(data_dir)!r}, *{list(args)!r}])
        """
    )
    env = {**os.environ, "COLUMNS": "120"}
    if warm_pool:
        env.pop("MWMS_AGENT_WARM_POOL", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=170, env=env)


def test_quickstart_reports_a_failed_job_and_stops_everything(tmp_path: Path) -> None:
    example = tmp_path / "failing"
    example.mkdir()
    (example / "train.py").write_text(FAILING_PROGRAM)
    data_dir = tmp_path / "qs"
    result = _run_quickstart(data_dir, example)
    assert result.returncode == 1, result.stderr
    assert "FAILED" in result.stdout
    assert "something broke in worker 1" in result.stderr  # the failed task's last lines
    assert str(data_dir / "logs") in result.stderr
    assert (data_dir / "logs" / "coordinator.log").exists()
    assert not _processes_mentioning(str(data_dir)), "quickstart left processes behind"
    # The dashboard's log-in token is in a private file whose path is printed; the token itself never is.
    token_file = data_dir / "admin-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    # Said at submit, with the job's address; no address is printed for a coordinator about to stop.
    assert "follow it live at http://127.0.0.1:" in result.stderr
    assert f"log in there with the admin token in {token_file}" in result.stderr
    assert "dashboard and API" not in result.stdout + result.stderr
    assert "run again with --keep-running" in result.stderr
    # Without warm pools nothing is waited for, and the results say why the workers started cold.
    assert "the agents keep no warm interpreters" in result.stderr
    assert "worker 1 started cold: the agents keep no warm interpreters" in result.stdout
    token = token_file.read_text().strip()
    logs = "".join(path.read_text() for path in (data_dir / "logs").iterdir())
    assert token not in result.stdout + result.stderr + logs


def test_quickstart_reuses_its_admin_token(tmp_path: Path) -> None:
    example = tmp_path / "failing"
    example.mkdir()
    (example / "train.py").write_text(FAILING_PROGRAM)
    data_dir = tmp_path / "qs"
    data_dir.mkdir()
    (data_dir / "admin-token").write_text("an-earlier-runs-admin-token-value\n")
    result = _run_quickstart(data_dir, example)
    assert result.returncode == 1, result.stderr  # the agents joined and the job ran: the token worked
    assert (data_dir / "admin-token").read_text().strip() == "an-earlier-runs-admin-token-value"


@pytest.mark.tf
def test_quickstart_runs_the_keras_example_in_warm_interpreters(tmp_path: Path) -> None:
    """As `make demo` runs it: the agents keep their default warm pool, and the job waits for it."""
    data_dir = tmp_path / "qs"
    result = _run_quickstart(data_dir, None, "--epochs", "2", "--steps-per-epoch", "5", warm_pool=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCEEDED" in result.stdout and "loss" in result.stdout
    artifacts = [line for line in result.stdout.splitlines() if line.startswith("artifacts: ")]
    assert artifacts, result.stdout
    downloaded = Path(artifacts[0].removeprefix("artifacts: "))
    assert downloaded.is_relative_to(data_dir / "artifacts") and any(downloaded.rglob("*"))
    # Without a terminal, step and loss come as plain lines while it trains, not only at the end.
    assert re.search(r"^step \d+/10, loss \d", result.stderr, re.M), result.stderr
    assert "waiting for the agents' warm interpreters" in result.stderr
    if sys.platform.startswith("linux"):  # elsewhere both agents advertise 127.0.0.1: co-located, cold
        assert "127.0.0.2:" in result.stderr  # the placement line: the second agent's own address
        started = re.findall(r"^worker (\d) started (\w+)", result.stdout, re.M)
        assert sorted(started) == [("0", "warm"), ("1", "warm")], result.stdout + result.stderr
    assert not _processes_mentioning(str(data_dir)), "quickstart left processes behind"
