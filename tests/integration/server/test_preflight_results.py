"""The coordinator's side of the preflight check, against a real coordinator (gRPC on loopback, SQLite):
StartTask asks for the check when the job does, results are stored once and read over REST, and a task that
fails its check fails the job with the check's message; jobs pinned to agents land where they name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from mwms.server.services.observing.preflight import preflight_wanted
from mwms.server.settings import Settings
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.agent_streams import (
    ADMIN_TOKEN,
    JOIN_TOKEN,
    Coordinator,
    hello,
)
from mwms_testkit.cluster import pack, wait_until


def _submit(coordinator: Coordinator, **spec: Any) -> str:
    uploaded = coordinator.http.post(
        "/api/v1/bundles", files={"file": ("b.tar.gz", pack({"t.py": "print(1)\n"}))}
    )
    assert uploaded.status_code in (200, 201), uploaded.text
    body = {"bundle_digest": uploaded.json()["digest"], "command": ["python", "t.py"], **spec}
    response = coordinator.http.post("/api/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    with ExitStack() as stack:
        yield Coordinator.for_streams(stack, tmp_path / "coordinator")


def test_a_failed_check_fails_the_job_with_its_message_and_results_are_kept(coordinator: Coordinator) -> None:
    a_id, a = coordinator.join("pf-a")
    b_id, b = coordinator.join("pf-b")
    hello(a, a_id)
    hello(b, b_id)
    job_id = _submit(coordinator, workers=2, preflight=True, agents=["pf-b", "pf-a"])
    start_b, start_a = b.next("start"), a.next("start")  # worker 0 on pf-b, worker 1 on pf-a
    assert (start_b.task_index, start_a.task_index) == (0, 1)
    for start in (start_a, start_b):
        assert start.preflight and start.preflight_timeout_seconds == 120
    job = coordinator.job(job_id)
    assert job["preflight"] is True and job["agents"] == ["pf-b", "pf-a"]

    report = {"ok": True, "allreduce": [{"bytes": 1 << 20, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]}
    a.send(preflight=pb.PreflightResult(task_id=start_a.task_id, ok=True, report_json=json.dumps(report)))
    message = (
        "worker 0 (host 127.0.0.1) cannot reach worker 1 at 127.0.0.1:21001: connection refused after 15 s"
    )
    failed = pb.PreflightResult(task_id=start_b.task_id, ok=False, message=message, report_json="{not json")
    b.send(preflight=failed)
    b.send(preflight=failed)  # resent: stored once
    b.send(
        task=pb.TaskReport(
            task_id=start_b.task_id,
            state=pb.TASK_STATE_FAILED,
            exit_code=3,
            message=f"preflight check failed: {message}",
            pid=7,
        )
    )
    stop = a.next("stop")  # the other worker is stopped at once
    assert stop.task_id == start_a.task_id
    a.send(task=pb.TaskReport(task_id=start_a.task_id, state=pb.TASK_STATE_STOPPED, message="stopped"))
    job = wait_until(lambda: (j := coordinator.job(job_id))["state"] == "FAILED" and j, 10, "the job to fail")
    assert job["reason"].startswith(f"task 0 on agent pf-b: preflight check failed: {message}"), job["reason"]
    assert "not retryable" in job["reason"]

    found = coordinator.http.get(f"/api/v1/jobs/{job_id}/preflight").json()
    [attempt] = found["attempts"]
    assert attempt["attempt"] == 1 and attempt["ok"] is False
    assert [(r["task_index"], r["ok"]) for r in attempt["results"]] == [(0, False), (1, True)]
    assert attempt["results"][0]["message"] == message and attempt["results"][0]["report"] == {}
    assert attempt["results"][1]["report"] == report
    assert coordinator.http.get("/api/v1/jobs/nope/preflight").status_code == 404
    a.close()
    b.close()


def test_start_asks_for_the_check_only_when_the_job_wants_it_and_has_a_gang(coordinator: Coordinator) -> None:
    agent_id, stream = coordinator.join("pf-solo")
    hello(stream, agent_id)
    single = _submit(coordinator, workers=1, preflight=True)
    assert not stream.next("start").preflight
    stream.send(
        task=pb.TaskReport(task_id=coordinator.job(single)["tasks"][0]["id"], state=pb.TASK_STATE_SUCCEEDED)
    )
    wait_until(lambda: coordinator.job(single)["state"] == "SUCCEEDED", 10, "the single-worker job to end")
    pinned = _submit(coordinator, workers=2, agents=["pf-solo", "pf-gone"])
    job = wait_until(lambda: "pf-gone" in (j := coordinator.job(pinned))["reason"] and j, 10, "a reason")
    assert job["state"] == "PENDING" and "pf-gone is offline or unknown" in job["reason"]
    stream.close()


def test_the_job_decides_else_the_coordinator_default() -> None:
    class Job:
        def __init__(self, value: bool | None, workers: int = 2) -> None:
            self.options = {"preflight": value}
            self.num_workers = workers

    assert preflight_wanted(Job(None), default=True) and not preflight_wanted(Job(None), default=False)
    assert preflight_wanted(Job(True), default=False) and not preflight_wanted(Job(False), default=True)
    assert not preflight_wanted(Job(True, workers=1), default=True)


def test_the_coordinator_defaults_can_turn_the_check_on_without_its_all_reduce(tmp_path) -> None:
    settings = Settings(
        data_dir=tmp_path / "coordinator",
        grpc_port=0,
        join_token=JOIN_TOKEN,
        admin_token=ADMIN_TOKEN,
        agent_timeout_s=300,
        preflight=True,
        preflight_allreduce=False,
        preflight_timeout_s=30,
    )
    with ExitStack() as stack:
        here = Coordinator.start(stack, settings, admin_token=ADMIN_TOKEN)
        a_id, a = here.join("dflt-a")
        hello(a, a_id)
        b_id, b = here.join("dflt-b")
        hello(b, b_id)
        streams = {"dflt-a": a, "dflt-b": b}

        def run(agents: list[str], **spec: Any) -> pb.StartTask:
            """Submits a 2-worker job on `agents`, ends it, and returns worker 0's StartTask."""
            job_id = _submit(here, workers=2, agents=agents, **spec)
            starts = [streams[name].next("start", where=lambda s: s.job_id == job_id) for name in agents]
            for name, start in zip(agents, starts, strict=True):
                done = pb.TaskReport(task_id=start.task_id, state=pb.TASK_STATE_SUCCEEDED, pid=1)
                streams[name].send(task=done)
            wait_until(lambda: here.job(job_id)["state"] == "SUCCEEDED", 10, f"job {job_id} to end")
            return starts[0]

        start = run(["dflt-a", "dflt-b"])  # preflight not set: the coordinator's default
        assert start.preflight and start.preflight_timeout_seconds == 30
        assert start.env["MWMS_PREFLIGHT_ALLREDUCE"] == "0"
        asked = run(["dflt-b", "dflt-a"], env={"MWMS_PREFLIGHT_ALLREDUCE": "1"})
        assert asked.preflight and asked.env["MWMS_PREFLIGHT_ALLREDUCE"] == "1"
        explicit = run(["dflt-a", "dflt-b"], preflight=True)  # the job asked: the full check
        assert explicit.preflight and "MWMS_PREFLIGHT_ALLREDUCE" not in explicit.env
        assert not run(["dflt-a", "dflt-b"], preflight=False).preflight
        a.close()
        b.close()
