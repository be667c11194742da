"""Ctrl-C while `mwms submit --wait` follows a job, against the real coordinator: with no agents the job
is PENDING, and the answer says it stays queued and how to cancel it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli_real_coordinator import admin_token, coordinator, coordinator_process, program
from typer.testing import CliRunner

from mwms.cli import submit
from mwms.cli.main import app

pytestmark = pytest.mark.e2e
runner = CliRunner()
__all__ = ["admin_token", "coordinator", "coordinator_process", "program"]  # fixtures used here


def test_ctrl_c_on_a_pending_job_says_it_stays_queued(
    coordinator: str, program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = submit.TextFollower.on_job

    def interrupted_after_the_first_answer(self: submit.TextFollower, job: dict[str, Any]) -> None:
        seen(self, job)
        raise KeyboardInterrupt  # what Ctrl-C raises in the poll loop

    monkeypatch.setattr(submit.TextFollower, "on_job", interrupted_after_the_first_answer)
    result = runner.invoke(
        app, ["submit", str(program), "-n", "1", "--wait", "--api", coordinator, "--", "python", "t.py"]
    )
    assert result.exit_code == 130, result.output
    job_id = result.stdout.splitlines()[0]
    assert (
        f"stopped following; job {job_id} stays queued (PENDING): watch it with mwms logs {job_id} --follow, "
        f"cancel it with mwms cancel {job_id}"
    ) in " ".join(result.stderr.split())
    cancelled = runner.invoke(app, ["cancel", job_id, "--api", coordinator])
    assert cancelled.exit_code == 0, cancelled.output
