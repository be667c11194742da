"""mwms.Client over real HTTP against the fake API (fast): resolution, submit, wait, logs, metrics, artifacts,
typed errors, and what is retried and what is not (against a real flaky HTTP server)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import mwms
from mwms import Client
from mwms.connection import StoredConfig, save_config
from mwms.errors import (
    Conflict,
    CoordinatorUnreachable,
    Forbidden,
    InvalidSpec,
    JobFailed,
    MwmsError,
    NotFound,
    Unauthorized,
    WaitTimeout,
)
from mwms.metrics_line import parse_value
from mwms_testkit.fake_api import VIEWER_TOKEN, FakeState

# -- import and resolution ---------------------------------------------------------------------------------


def test_import_mwms_stays_light() -> None:
    code = (
        "import sys, mwms; assert 'httpx' not in sys.modules and 'mwms.client' not in sys.modules; "
        "from mwms import Client, JobFailed; assert 'httpx' in sys.modules; print(Client.__module__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "mwms.client.client"


def test_every_public_name_is_documented() -> None:
    for name in mwms.__all__:
        if name == "__version__":
            continue
        value = getattr(mwms, name)
        assert value.__doc__, name
        for attribute, member in vars(value).items():
            if not attribute.startswith("_") and callable(member) and attribute != "from_api":
                assert member.__doc__, f"{name}.{attribute}"


def test_resolves_like_the_cli(
    fake_api: tuple[str, FakeState], user_token: str, private_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, _ = fake_api
    save_config(StoredConfig(api=api, token=user_token), private_config)
    with Client() as client:  # what `mwms login` saved
        assert client.api == api and client.whoami()["user"] == "bob"
    monkeypatch.setenv("MWMS_TOKEN", VIEWER_TOKEN)
    with Client() as client:  # the environment wins over the config file
        assert client.whoami()["user"] == "carol"
    with Client(token=user_token) as client:  # an argument wins over both
        assert client.whoami()["user"] == "bob"


# -- jobs --------------------------------------------------------------------------------------------------


def test_submit_wait_logs_metrics_artifacts(
    fake_api: tuple[str, FakeState], user_token: str, program: Path, tmp_path: Path
) -> None:
    api, state = fake_api
    with Client(api, token=user_token) as client:
        job = client.submit(program, "python train.py --epochs 3", workers=2, env={"A": "1"})
        assert job.state == "PENDING" and job.name == "my-program"
        assert state.jobs[job.id].spec["command"] == ["python", "train.py", "--epochs", "3"]
        key = state.idempotency_keys[-1]
        assert key and len(key) == 32, "every submit carries an idempotency key"
        seen: list[tuple[str, int | None]] = []
        assert (
            job.wait(on_progress=lambda j: seen.append((j.state, j.step)), poll_interval=0.05) == "SUCCEEDED"
        )
        assert seen[0] == ("RUNNING", None) and seen[-1] == ("SUCCEEDED", 20)
        assert job.loss == 0.25
        assert [line.text for line in job.logs(task=0)] == [
            "epoch 1 starting",
            "step 10 loss 0.5",
            "a warning",
            "done",
        ]
        metrics = job.metrics()
        assert metrics.names() == ["accuracy", "loss"]
        assert [(p.step, p.value) for p in job.metrics("loss")] == [(10, 0.5), (20, 0.25)]
        state.artifacts[job.id] = {"model/saved_model.pb": b"pb", "notes.txt": b"hi"}
        assert sorted(a.path for a in job.artifacts()) == ["model/saved_model.pb", "notes.txt"]
        written = job.download(tmp_path / "out")
        assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in written) == [
            "model/saved_model.pb",
            "notes.txt",
        ]
        assert (tmp_path / "out" / "model" / "saved_model.pb").read_bytes() == b"pb"
        assert [j.id for j in client.jobs(state="SUCCEEDED")] == [job.id]
        assert client.jobs(state=["FAILED", "CANCELLED"]) == []
        assert client.agents()[0].name == "local-1"


def test_follow_logs_until_the_job_ends(
    fake_api: tuple[str, FakeState], user_token: str, program: Path
) -> None:
    with Client(fake_api[0], token=user_token) as client:
        job = client.submit(program, ["python", "train.py"], workers=2)
        texts = [line.text for line in job.logs(task=0, follow=True)]
    assert texts == ["epoch 1 starting", "step 10 loss 0.5", "a warning", "done"]


def test_failed_job_raises_job_failed_with_the_culprits_last_lines(
    fake_api: tuple[str, FakeState], user_token: str, program: Path
) -> None:
    with Client(fake_api[0], token=user_token) as client:
        job = client.submit(program, ["python", "fail.py"], workers=2)
        with pytest.raises(JobFailed) as raised:
            job.wait(poll_interval=0.05)
        assert client.job(job.id).wait(raise_on_failure=False) == "FAILED"
    failure = raised.value
    assert failure.reason == "task 1 exited with code 3" and failure.task == 1
    assert failure.log_lines[-1] == "Traceback: boom"
    assert "Traceback: boom" in str(failure) and job.id in str(failure)


def test_wait_timeout_leaves_the_job_running(
    fake_api: tuple[str, FakeState], user_token: str, program: Path
) -> None:
    with Client(fake_api[0], token=user_token) as client:
        job = client.submit(program, ["python", "train.py"], workers=1)
        with pytest.raises(WaitTimeout, match="keeps running"):
            job.wait(timeout=0.0)
        assert isinstance(WaitTimeout("x"), TimeoutError)
        assert job.cancel().state == "CANCELLED"
        assert job.wait() == "CANCELLED"
        with pytest.raises(Conflict, match="already ended"):
            job.cancel()


def test_non_finite_metric_values_are_floats(
    fake_api: tuple[str, FakeState], user_token: str, program: Path
) -> None:
    api, state = fake_api
    with Client(api, token=user_token) as client:
        job = client.submit(program, ["python", "train.py"], workers=1)
        state.jobs[job.id].metrics = [
            {"name": "loss", "step": step, "value": value, "wall_time": "2026-01-01T00:00:00Z", "attempt": 1}
            for step, value in enumerate([0.5, "NaN", "Infinity", "-Infinity"])
        ]
        values = [point.value for point in job.metrics("loss")]
        state.jobs[job.id].loss = "NaN"
        assert math.isnan(job.refresh().loss or 0.0)
    assert values[0] == 0.5 and math.isnan(values[1]) and values[2:4] == [math.inf, -math.inf]
    # null, what older coordinators sent for NaN (the fake answers only what MetricPointOut allows now)
    assert math.isnan(parse_value(None))


def test_to_pandas_without_pandas_says_how_to_get_it(
    fake_api: tuple[str, FakeState], user_token: str, program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    with Client(fake_api[0], token=user_token) as client:
        job = client.submit(program, ["python", "train.py"], workers=1)
        with pytest.raises(ImportError, match="pip install pandas"):
            job.metrics().to_pandas()


def test_to_pandas_with_pandas(fake_api: tuple[str, FakeState], user_token: str, program: Path) -> None:
    pytest.importorskip("pandas")
    with Client(fake_api[0], token=user_token) as client:
        frame = client.submit(program, ["python", "train.py"], workers=1).metrics().to_pandas()
    assert list(frame.columns) == ["name", "step", "value", "attempt", "wall_time"] and len(frame) == 4


# -- typed errors ------------------------------------------------------------------------------------------


def test_errors_are_typed_and_carry_the_apis_message(
    fake_api: tuple[str, FakeState], user_token: str, program: Path, tmp_path: Path
) -> None:
    api, _ = fake_api
    with Client(api, token=user_token) as client:
        with pytest.raises(NotFound, match="job nope not found"):
            client.job("nope")
        with pytest.raises(InvalidSpec, match="TF_CONFIG is set by mwms") as invalid:
            client.submit(program, ["python", "train.py"], workers=1, env={"TF_CONFIG": "x"})
        assert invalid.value.status == 422
        with pytest.raises(InvalidSpec, match="does not exist") as local:
            client.submit(tmp_path / "nowhere", ["python"], workers=1)
        assert local.value.status is None
    with Client(api, token="mwms_not-a-real-token") as client, pytest.raises(Unauthorized) as refused:
        client.jobs()
    assert refused.value.status == 401 and not isinstance(refused.value, Forbidden)
    with Client(api, token=VIEWER_TOKEN) as client, pytest.raises(Forbidden, match="needs the user role"):
        client.submit(program, ["python", "train.py"], workers=1)
    assert issubclass(Forbidden, Unauthorized) and issubclass(JobFailed, MwmsError)


# -- retries -----------------------------------------------------------------------------------------------


class _Flaky:
    """A real HTTP server that answers 503 to the first `failures` requests, then 200 with a job object."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.requests: list[tuple[str, str, str | None]] = []
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                flaky.requests.append((self.command, self.path, self.headers.get("idempotency-key")))
                failing = len(flaky.requests) <= flaky.failures
                body = json.dumps(
                    {"detail": "upstream restarting"} if failing else {"id": "j1", "state": "PENDING"}
                )
                self.send_response(503 if failing else 200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def flaky() -> Iterator[_Flaky]:
    server = _Flaky(failures=2)
    yield server
    server.server.shutdown()


def test_gets_are_retried_through_503s(flaky: _Flaky) -> None:
    with Client(flaky.url, retry_seconds=10) as client:
        assert client.job("j1").id == "j1"
    assert [method for method, _, _ in flaky.requests] == ["GET"] * 3


def test_a_keyed_submit_is_resent_with_the_same_key(flaky: _Flaky) -> None:
    with Client(flaky.url, retry_seconds=10) as client:
        client.create_job({"command": ["x"]}, idempotency_key="run-7:train")
    assert flaky.requests == [("POST", "/api/v1/jobs", "run-7:train")] * 3


def test_other_posts_are_not_resent(flaky: _Flaky) -> None:
    with Client(flaky.url, retry_seconds=10) as client, pytest.raises(CoordinatorUnreachable) as raised:
        client.rest.cancel_job("j1")
    assert raised.value.status == 503 and "upstream restarting" in raised.value.detail
    assert len(flaky.requests) == 1


def test_retries_end_within_their_budget() -> None:
    flaky = _Flaky(failures=1000)
    try:
        started = time.monotonic()
        with Client(flaky.url, retry_seconds=1.0) as client, pytest.raises(CoordinatorUnreachable):
            client.jobs()
        assert time.monotonic() - started < 3.0
        assert 2 <= len(flaky.requests) <= 8
    finally:
        flaky.server.shutdown()
