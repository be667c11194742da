"""The CLI commands over real HTTP on top of mwms.Client, against the fake API served by uvicorn on a free port."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mwms.cli import connect
from mwms.cli.main import app
from mwms.client import Client
from mwms.errors import CoordinatorUnreachable, InvalidSpec, NotFound, ServerError
from mwms_testkit.fake_api import USER_TOKEN, FakeState

runner = CliRunner()


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def program(tmp_path: Path) -> Path:
    directory = tmp_path / "my-program"
    directory.mkdir()
    (directory / "train.py").write_text("print('training')\n")
    (directory / ".git").mkdir()
    (directory / ".git" / "HEAD").write_text("ref")
    return directory


def _submit(api: str, program: Path, *extra: str) -> object:
    return runner.invoke(app, ["submit", str(program), "--workers", "2", "--api", api, *extra])


@pytest.fixture(autouse=True)
def short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands give up on an unreachable coordinator after 1 s here, not after RETRY_SECONDS."""
    monkeypatch.setattr(connect, "RETRY_SECONDS", 1.0)


# -- client error mapping ----------------------------------------------------------------------------------


def test_client_maps_404_with_the_apis_detail(fake_api: tuple[str, FakeState]) -> None:
    with Client(fake_api[0], token=USER_TOKEN) as client, pytest.raises(NotFound) as raised:
        client.job("nope")
    assert raised.value.status == 404
    assert raised.value.detail == "job nope not found"


def test_client_flattens_validation_errors(fake_api: tuple[str, FakeState]) -> None:
    with Client(fake_api[0], token=USER_TOKEN) as client, pytest.raises(InvalidSpec) as raised:
        client.create_job({"bundle_digest": "x", "command": [], "workers": 0})
    assert raised.value.status == 422
    assert "workers" in raised.value.detail and "command" in raised.value.detail


def test_client_maps_500(fake_api: tuple[str, FakeState]) -> None:
    fake_api[1].server_error = "database is on fire"
    with Client(fake_api[0], token=USER_TOKEN) as client, pytest.raises(ServerError) as raised:
        client.rest._json("GET", "/api/v1/jobs")
    assert (raised.value.status, raised.value.detail) == (500, "database is on fire")


def test_client_reports_unreachable_coordinator() -> None:
    client = Client(f"http://127.0.0.1:{_unused_port()}", retry_seconds=0.5)
    with client, pytest.raises(CoordinatorUnreachable) as raised:
        client.jobs()
    assert raised.value.status is None


def test_upload_sends_content_length_and_reports_progress(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    from mwms.client.packing import pack_directory

    api, state = fake_api
    bundle = pack_directory(program)
    seen: list[int] = []
    with Client(api, token=USER_TOKEN) as client:
        result = client.rest.upload_bundle(bundle.file, on_bytes=seen.append)
    bundle.close()
    assert result["size"] == bundle.size == sum(seen)
    assert state.upload_content_lengths[-1] is not None


# -- exit codes of commands --------------------------------------------------------------------------------


def test_unreachable_coordinator_exits_3_and_says_how_to_start_one() -> None:
    api = f"http://127.0.0.1:{_unused_port()}"
    result = runner.invoke(app, ["jobs", "--api", api])
    assert result.exit_code == 3
    assert api in result.stderr and "mwms server" in result.stderr
    assert "Traceback" not in result.output


def test_api_from_environment(fake_api: tuple[str, FakeState]) -> None:
    result = runner.invoke(app, ["jobs", "--json"], env={"MWMS_API": fake_api[0]})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total"] == 0


def test_unknown_job_exits_4(fake_api: tuple[str, FakeState]) -> None:
    for command in (["status", "nope"], ["logs", "nope"], ["cancel", "nope"], ["metrics", "nope"]):
        result = runner.invoke(app, [*command, "--api", fake_api[0]])
        assert result.exit_code == 4, (command, result.output)
        assert "job nope not found" in result.stderr


def test_rejected_request_exits_2_with_the_apis_detail(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    result = _submit(fake_api[0], program, "--env", "TF_CONFIG=x", "--", "python", "train.py")
    assert result.exit_code == 2
    assert "TF_CONFIG is set by mwms" in result.stderr


def test_env_without_equals_exits_2(fake_api: tuple[str, FakeState], program: Path) -> None:
    result = _submit(fake_api[0], program, "--env", "NOPE", "--", "python", "train.py")
    assert result.exit_code == 2
    assert "NAME=VALUE" in result.stderr
    assert not fake_api[1].bundles, "nothing is uploaded when the arguments are wrong"


def test_submit_of_empty_directory_exits_2(fake_api: tuple[str, FakeState], tmp_path: Path) -> None:
    result = _submit(fake_api[0], tmp_path, "--", "python", "train.py")
    assert result.exit_code == 2
    assert "no files to pack" in result.stderr


# -- submit ------------------------------------------------------------------------------------------------


def test_submit_prints_job_id_first_and_sends_the_spec(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    api, state = fake_api
    result = _submit(
        api,
        program,
        "--env",
        "A=1",
        "--communication",
        "ring",
        "--max-restarts",
        "0",
        "--",
        "python",
        "train.py",
        "--epochs",
        "3",
    )
    assert result.exit_code == 0, result.output
    job_id = result.stdout.splitlines()[0]
    job = state.jobs[job_id].detail()
    assert job["name"] == "my-program"
    assert job["command"] == ["python", "train.py", "--epochs", "3"]
    assert job["env_names"] == ["A"]
    assert job["communication"]["implementation"] == "RING"
    assert job["restart"]["max_restarts"] == 0


def test_submit_json_prints_only_the_job(fake_api: tuple[str, FakeState], program: Path) -> None:
    result = _submit(fake_api[0], program, "--json", "--name", "named", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "named"


def test_submit_wait_follows_to_success(fake_api: tuple[str, FakeState], program: Path) -> None:
    result = _submit(fake_api[0], program, "--wait", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("job")
    # The chief's log, in order, and no other task's.
    assert lines[1:] == ["epoch 1 starting", "step 10 loss 0.5", "a warning", "done"]
    assert "SUCCEEDED" in result.stderr and "RUNNING" in result.stderr


def test_submit_wait_exits_1_when_the_job_fails(fake_api: tuple[str, FakeState], program: Path) -> None:
    result = _submit(fake_api[0], program, "--wait", "--", "python", "fail.py")
    assert result.exit_code == 1, result.output
    assert "task 1 exited with code 3" in result.stderr
    assert "Traceback: boom" in result.stderr  # the failed task's last lines


# -- read commands -----------------------------------------------------------------------------------------


def _finished_job(api: str, program: Path) -> str:
    result = _submit(api, program, "--wait", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()[0]


def test_jobs_status_metrics_agents(fake_api: tuple[str, FakeState], program: Path) -> None:
    api = fake_api[0]
    job_id = _finished_job(api, program)
    jobs = runner.invoke(app, ["jobs", "--api", api, "--state", "succeeded"])
    assert jobs.exit_code == 0 and job_id in jobs.stdout
    as_json = json.loads(runner.invoke(app, ["jobs", "--api", api, "--json"]).stdout)
    assert as_json["jobs"][0]["id"] == job_id
    status = runner.invoke(app, ["status", job_id, "--api", api])
    assert status.exit_code == 0 and "SUCCEEDED" in status.stdout and "local-2" in status.stdout
    assert json.loads(runner.invoke(app, ["status", job_id, "--api", api, "--json"]).stdout)["id"] == job_id
    metrics = runner.invoke(app, ["metrics", job_id, "--api", api])
    assert metrics.exit_code == 0 and "LOSS" in metrics.stdout and "ACCURACY" in metrics.stdout
    points = json.loads(
        runner.invoke(app, ["metrics", job_id, "--name", "loss", "--api", api, "--json"]).stdout
    )
    assert {point["name"] for point in points["points"]} == {"loss"}
    agents = runner.invoke(app, ["agents", "--api", api])
    assert agents.exit_code == 0 and "local-1" in agents.stdout


def test_logs_pages_and_prefixes(fake_api: tuple[str, FakeState], program: Path) -> None:
    api = fake_api[0]
    job_id = _finished_job(api, program)
    every = runner.invoke(app, ["logs", job_id, "--api", api])
    assert every.exit_code == 0
    assert "[task 1] worker 1 says hi" in every.stdout and "[task 0] done" in every.stdout
    assert len(every.stdout.splitlines()) == 5
    chief = runner.invoke(app, ["logs", job_id, "--task", "0", "--tail", "1", "--api", api])
    assert chief.stdout.splitlines() == ["done"]


def test_logs_follow_streams_until_the_job_ends(fake_api: tuple[str, FakeState], program: Path) -> None:
    api = fake_api[0]
    submitted = _submit(api, program, "--", "python", "train.py")
    job_id = submitted.stdout.splitlines()[0]
    result = runner.invoke(app, ["logs", job_id, "--task", "0", "--follow", "--api", api])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["epoch 1 starting", "step 10 loss 0.5", "a warning", "done"]


def test_cancel(fake_api: tuple[str, FakeState], program: Path) -> None:
    api = fake_api[0]
    job_id = _submit(api, program, "--", "python", "train.py").stdout.splitlines()[0]
    result = runner.invoke(app, ["cancel", job_id, "--api", api])
    assert result.exit_code == 0 and "CANCELLED" in result.stdout
    again = runner.invoke(app, ["cancel", job_id, "--api", api])
    assert again.exit_code == 2 and "already ended" in again.stderr


def test_artifacts_download_keeps_relative_paths(
    fake_api: tuple[str, FakeState], program: Path, tmp_path: Path
) -> None:
    api, state = fake_api
    job_id = _finished_job(api, program)
    state.artifacts[job_id] = {"model/saved_model.pb": b"pb", "model/variables/v.data": b"v" * 1000}
    listed = runner.invoke(app, ["artifacts", job_id, "--api", api])
    assert listed.exit_code == 0 and "model/saved_model.pb" in listed.stdout
    target = tmp_path / "out"
    result = runner.invoke(app, ["artifacts", job_id, "--download", str(target), "--api", api])
    assert result.exit_code == 0, result.output
    assert (target / "model" / "saved_model.pb").read_bytes() == b"pb"
    assert (target / "model" / "variables" / "v.data").read_bytes() == b"v" * 1000
    assert not list(target.rglob("*.part"))


def test_artifacts_download_refuses_escaping_paths(
    fake_api: tuple[str, FakeState], program: Path, tmp_path: Path
) -> None:
    api, state = fake_api
    job_id = _finished_job(api, program)
    state.artifacts[job_id] = {"ok.txt": b"ok", "../evil.txt": b"evil"}
    target = tmp_path / "out"
    result = runner.invoke(app, ["artifacts", job_id, "--download", str(target), "--api", api])
    assert result.exit_code == 2
    assert "refusing artifact path" in result.stderr
    assert not (tmp_path / "evil.txt").exists() and not (target / "ok.txt").exists()


# -- on top of mwms.Client ---------------------------------------------------------------------------------


def test_submit_sends_fail_on_nan_and_an_idempotency_key(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    api, state = fake_api
    result = _submit(
        api, program, "--fail-on-nan", "loss", "--fail-on-nan", "val_loss", "--", "python", "t.py"
    )
    assert result.exit_code == 0, result.output
    job = state.jobs[result.stdout.splitlines()[0]].detail()
    assert job["restart"]["fail_on_nan"] == ["loss", "val_loss"]
    again = _submit(api, program, "--", "python", "t.py")
    assert state.jobs[again.stdout.splitlines()[0]].spec["restart"]["fail_on_nan"] == []
    first_key, second_key = state.idempotency_keys
    assert first_key and second_key and first_key != second_key, "one key per submit"


def test_metrics_show_non_finite_values(fake_api: tuple[str, FakeState], program: Path) -> None:
    api, state = fake_api
    job_id = _finished_job(api, program)
    state.jobs[job_id].metrics = [
        {"name": "loss", "step": step, "value": value, "wall_time": "2026-01-01T00:00:00Z", "attempt": 1}
        for step, value in ((1, 0.5), (2, "NaN"), (3, "Infinity"), (4, "-Infinity"))
    ]
    table = runner.invoke(app, ["metrics", job_id, "--api", api])
    assert table.exit_code == 0, table.output
    rows = [line.split() for line in table.stdout.splitlines()[1:]]
    assert rows == [["1", "0.5"], ["2", "nan"], ["3", "inf"], ["4", "-inf"]]
    as_json = json.loads(runner.invoke(app, ["metrics", job_id, "--api", api, "--json"]).stdout)
    assert [point["value"] for point in as_json["points"]] == [0.5, "NaN", "Infinity", "-Infinity"]
    state.jobs[job_id].loss = "NaN"
    assert "nan" in runner.invoke(app, ["jobs", "--api", api]).stdout


def test_commands_wait_out_a_short_outage(
    fake_api: tuple[str, FakeState], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read command retries while the address refuses connections, then answers once something listens."""
    import threading

    from mwms_testkit.fake_api import serve_fake_api

    monkeypatch.setattr(connect, "RETRY_SECONDS", 15.0)
    port = _unused_port()
    started = threading.Event()

    def serve_later() -> None:
        threading.Event().wait(1.0)
        with serve_fake_api(port=port):
            started.set()
            threading.Event().wait(10)

    threading.Thread(target=serve_later, daemon=True).start()
    result = runner.invoke(app, ["jobs", "--api", f"http://127.0.0.1:{port}", "--json"])
    assert started.is_set() and result.exit_code == 0, result.output
    assert json.loads(result.stdout)["total"] == 0
