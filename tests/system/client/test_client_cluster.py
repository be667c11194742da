"""mwms.Client against a real coordinator and agents (the shared cluster): a 2-worker Keras job from submit to
downloaded artifacts, a failing job, typed errors, and idempotent submits through a connection that drops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mwms import Client
from mwms.errors import Conflict, CoordinatorUnreachable, Forbidden, InvalidSpec, JobFailed, NotFound
from mwms_testkit import REPO
from mwms_testkit.cluster import free_port, pack
from mwms_testkit.dropping_proxy import dropping_proxy

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "keras_fit"


@pytest.mark.tf
def test_keras_example_submit_wait_metrics_artifacts(cluster, tmp_path: Path) -> None:
    with Client(cluster.api, token=cluster.admin_token) as client:
        job = client.submit(
            EXAMPLE,
            ["python", "train.py", "--epochs", "1", "--steps-per-epoch", "3"],
            workers=2,
            name="client-keras",
            restart={"max_restarts": 0},
        )
        seen: list[tuple[str, int | None]] = []
        final = job.wait(timeout=240, on_progress=lambda j: seen.append((j.state, j.step)))
        assert final == "SUCCEEDED", cluster.logs_text(job.id)
        assert seen[-1][0] == "SUCCEEDED" and any(state == "RUNNING" for state, _ in seen)
        assert job.raw["submitted_by"] == "admin" and len(job.tasks) == 2

        metrics = job.metrics()
        assert "loss" in metrics.names()
        loss = job.metrics("loss")
        assert loss and all(point.name == "loss" and isinstance(point.value, float) for point in loss)
        assert max(point.step for point in loss) == 3

        lines = [line.text for line in job.logs(task=0)]
        assert any(text.startswith("FINAL loss=") for text in lines)

        artifacts = job.artifacts()
        assert any(artifact.path.startswith("model.keras") for artifact in artifacts)
        written = job.download(tmp_path / "artifacts")
        assert len(written) == len(artifacts)
        for artifact, path in zip(artifacts, written, strict=True):
            assert path.stat().st_size == artifact.size


def test_failed_job_raises_job_failed_with_reason_and_log(cluster, tmp_path: Path) -> None:
    program = tmp_path / "failing"
    program.mkdir()
    (program / "main.py").write_text(
        "import os, sys\n"
        "if os.environ['MWMS_TASK_INDEX'] == '1':\n"
        "    print('loading data', flush=True)\n"
        "    print('ValueError: the shards are empty', file=sys.stderr, flush=True)\n"
        "    sys.exit(3)\n"
        "import time; time.sleep(30)\n"
    )
    with Client(cluster.api, token=cluster.admin_token) as client:
        job = client.submit(program, "python main.py", workers=2, restart={"max_restarts": 0})
        with pytest.raises(JobFailed) as raised:
            job.wait(timeout=120)
    failure = raised.value
    assert failure.job_id == job.id and failure.state == "FAILED" and job.state == "FAILED"
    assert failure.reason == job.reason and "exit" in failure.reason and "3" in failure.reason
    assert failure.task == 1
    # One line on stdout, one on stderr: two pipes, read by two threads, so their order is not fixed.
    assert sorted(failure.log_lines[-2:]) == ["ValueError: the shards are empty", "loading data"]


def test_typed_errors_from_the_real_coordinator(cluster, tmp_path: Path) -> None:
    program = tmp_path / "p"
    program.mkdir()
    (program / "main.py").write_text("print('hi')\n")
    with Client(cluster.api, token=cluster.admin_token) as client:
        with pytest.raises(NotFound, match="no job with id nope"):
            client.job("nope")
        with pytest.raises(InvalidSpec, match="workers") as invalid:
            client.submit(program, "python main.py", workers=0)
        assert invalid.value.status == 422
        job = client.submit(program, "python main.py", workers=1)
        assert job.wait(timeout=60) == "SUCCEEDED"
        with pytest.raises(Conflict):
            job.cancel()
    with Client(cluster.api, token=cluster.create_token("vera", "viewer")) as viewer:
        assert viewer.job(job.id).state == "SUCCEEDED"
        with pytest.raises(Forbidden):
            viewer.submit(program, "python main.py", workers=1)
    with Client(f"http://127.0.0.1:{free_port()}", retry_seconds=0.5) as nowhere:
        with pytest.raises(CoordinatorUnreachable):
            nowhere.agents()


# -- idempotent submits ------------------------------------------------------------------------------------


def _jobs_named(cluster, name: str) -> list[dict]:
    page = cluster.http.get("/api/v1/jobs", params={"limit": 500}).json()
    return [job for job in page["jobs"] if job["name"] == name]


def test_a_submit_whose_response_is_lost_is_resent_and_creates_one_job(cluster, tmp_path: Path) -> None:
    program = tmp_path / "p"
    program.mkdir()
    (program / "main.py").write_text("print('once')\n")
    with dropping_proxy(cluster.http_port, drops=1) as proxy:
        with Client(proxy.url, token=cluster.admin_token, retry_seconds=20) as client:
            job = client.submit(program, "python main.py", workers=1, name="lost-response")
        submits = [line for line in proxy.requests_seen if line.startswith(b"POST /api/v1/jobs ")]
        assert proxy.dropped == 1 and len(submits) == 2, proxy.requests_seen
    assert [found["id"] for found in _jobs_named(cluster, "lost-response")] == [job.id]
    assert cluster.wait_for(job.id, {"SUCCEEDED"}, timeout=60)


def test_a_submit_without_a_key_is_not_resent(cluster, tmp_path: Path) -> None:
    program = tmp_path / "p"
    program.mkdir()
    (program / "main.py").write_text("print('maybe')\n")
    with dropping_proxy(cluster.http_port, drops=1) as proxy:
        with Client(proxy.url, token=cluster.admin_token, retry_seconds=20) as client:
            digest = client.upload(program)
            spec = {
                "name": "unkeyed",
                "bundle_digest": digest,
                "command": ["python", "main.py"],
                "workers": 1,
            }
            with pytest.raises(CoordinatorUnreachable):
                client.rest.create_job(spec)  # no idempotency key: the client cannot know, so it says so
        assert [line for line in proxy.requests_seen if line.startswith(b"POST /api/v1/jobs ")] == [
            b"POST /api/v1/jobs HTTP/1.1"
        ]
    assert len(_jobs_named(cluster, "unkeyed")) == 1  # it did reach the coordinator


def test_the_api_returns_the_keyed_job_and_refuses_the_key_for_another_spec(cluster) -> None:
    digest = cluster.upload(pack({"main.py": "print('keyed')\n"}))
    spec = {"name": "keyed", "bundle_digest": digest, "command": ["python", "main.py"], "workers": 1}
    key = {"Idempotency-Key": "pipeline-42:train.1"}
    first = cluster.http.post("/api/v1/jobs", json=spec, headers=key)
    again = cluster.http.post("/api/v1/jobs", json=spec, headers=key)
    assert first.status_code == 201, first.text
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]

    other = cluster.http.post("/api/v1/jobs", json={**spec, "workers": 2, "env": {"A": "1"}}, headers=key)
    assert other.status_code == 409
    assert first.json()["id"] in other.json()["detail"] and "workers, env" in other.json()["detail"]

    theirs = cluster.client(cluster.create_token("uma", "user")).post("/api/v1/jobs", json=spec, headers=key)
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"], "keys are per user"
    assert len(_jobs_named(cluster, "keyed")) == 2

    for bad in ("", "x" * 101, "has space", "a/b", "semi;colon"):
        refused = cluster.http.post("/api/v1/jobs", json=spec, headers={"Idempotency-Key": bad})
        assert refused.status_code == 422 and "Idempotency-Key" in refused.text, (bad, refused.text)
    assert len(_jobs_named(cluster, "keyed")) == 2


@pytest.mark.tf
def test_the_notebook_example_runs_end_to_end(cluster, tmp_path: Path) -> None:
    script = EXAMPLE.parent / "notebook_submit.py"
    token_file = tmp_path / "token"
    token_file.write_text(cluster.admin_token + "\n")
    argv = [sys.executable, str(script), "--api", cluster.api, "--token-file", str(token_file)]
    argv += ["--epochs", "1", "--steps-per-epoch", "3", "--output", str(tmp_path / "out")]
    env = {key: value for key, value in os.environ.items() if not key.startswith("MWMS_")}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    job_id = out.split("submitted job ", 1)[1].split()[0]
    assert "RUNNING" in out and f"job {job_id} ended SUCCEEDED" in out
    header = next(line for line in out.splitlines() if line.split()[:1] == ["step"])
    assert "loss" in header.split()
    assert f"artifacts to {tmp_path / 'out' / job_id}" in out
    assert any((tmp_path / "out" / job_id).rglob("*")), "the artifacts were downloaded"
    assert cluster.admin_token not in out + result.stderr
