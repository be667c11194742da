"""`mwms submit --memory-per-worker SIZE --cpus-per-worker N` send bytes and CPUs in the job spec (a size
that cannot be read is refused before anything is uploaded), and `mwms status` / `mwms agents` show memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app
from mwms.cli.output import agent_memory, format_resources, task_memory
from mwms_testkit.fake_api import FakeState

runner = CliRunner()
GiB = 2**30


@pytest.fixture
def program(tmp_path: Path) -> Path:
    directory = tmp_path / "my-program"
    directory.mkdir()
    (directory / "train.py").write_text("print('training')\n")
    return directory


def submit(api: str, program: Path, *extra: str) -> object:
    return runner.invoke(
        app, ["submit", str(program), "--workers", "2", "--api", api, *extra, "--", "python", "t.py"]
    )


def test_submit_sends_memory_in_bytes_and_cpus(fake_api: tuple[str, FakeState], program: Path) -> None:
    api, state = fake_api
    result = submit(api, program, "--memory-per-worker", "8G", "--cpus-per-worker", "2.5")
    assert result.exit_code == 0, result.output
    job = state.jobs[result.stdout.splitlines()[0]].detail()
    assert (job["memory_per_worker"], job["cpus_per_worker"]) == (8 * GiB, 2.5)
    status = runner.invoke(app, ["status", job["id"], "--api", api])
    assert status.exit_code == 0, status.output
    assert "8 GiB memory, 2.5 CPUs per worker" in status.stdout


@pytest.mark.parametrize(
    ("extra", "complaint"),
    [
        (("--memory-per-worker", "8X"), "--memory-per-worker '8X': give a size such as 8G or 512M"),
        (("--cpus-per-worker", "0"), "--cpus-per-worker 0: give more than 0 and at most 1024"),
    ],
)
def test_bad_values_exit_2_before_any_upload(
    fake_api: tuple[str, FakeState], program: Path, extra: tuple[str, ...], complaint: str
) -> None:
    api, state = fake_api
    result = submit(api, program, *extra)
    assert result.exit_code == 2, result.output
    assert complaint in result.stderr
    assert not state.bundles and not state.jobs


def test_too_little_memory_is_the_coordinators_refusal(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    result = submit(fake_api[0], program, "--memory-per-worker", "1M")
    assert result.exit_code == 2, result.output
    assert "64 MiB" in result.stderr


def test_memory_as_people_read_it() -> None:
    assert (
        task_memory({"peak_memory_bytes": 1288490188, "memory_limit_bytes": 8 * GiB})
        == "peak 1.2 GiB of 8 GiB"
    )
    assert task_memory({"peak_memory_bytes": GiB}) == "peak 1 GiB"
    assert task_memory({"memory_limit_bytes": 8 * GiB}) == "limit 8 GiB"
    assert task_memory({}) == "-"
    assert format_resources({}) == "the agents' defaults"
    assert format_resources({"cpus_per_worker": 1}) == "1 CPU per worker"
    assert (
        agent_memory({"memory_bytes": 64 * GiB}) == "64 GiB" and agent_memory({"memory_bytes": None}) == "-"
    )
