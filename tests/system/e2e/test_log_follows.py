"""Log follows against a real coordinator of their own (small caps, a short idle timeout) and one agent:
capped per user and in all with a 429 naming the limit, freed when the client goes, ended when the job
ends or nothing came for the idle timeout, and none of it disturbs a running job."""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import pytest

from mwms_testkit.cluster import Cluster, pack, wait_until

pytestmark = pytest.mark.e2e
IDLE_TIMEOUT_S = 8


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    instance = Cluster(
        root=tmp_path_factory.mktemp("follows"),
        server_env={
            "MWMS_MAX_FOLLOWS_PER_USER": "2",
            "MWMS_MAX_FOLLOWS_TOTAL": "3",
            "MWMS_FOLLOW_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S),
        },
    )
    try:
        instance.start_server()
        instance.start_agent("follow-agent", 22000)
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def waiting_job(coordinator):
    """A job that never starts (pinned to an agent that never joins), so it never ends by itself."""
    digest = coordinator.upload(pack({"a.py": "print(1)"}))
    body = {
        "bundle_digest": digest,
        "command": ["python", "a.py"],
        "workers": 1,
        "agents": ["not-joined-yet"],
    }
    response = coordinator.http.post("/api/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _follow(stack: contextlib.ExitStack, client: httpx.Client, job_id: str) -> httpx.Response:
    """Opens a follow and keeps it open until `stack` closes; the response's status is known."""
    return stack.enter_context(client.stream("GET", f"/api/v1/jobs/{job_id}/logs", params={"follow": "true"}))


def _can_follow(client: httpx.Client, job_id: str) -> bool:
    with contextlib.ExitStack() as stack:
        return _follow(stack, client, job_id).status_code == 200


def test_follows_past_a_cap_get_a_429_naming_it(coordinator, waiting_job):
    ann = coordinator.client(coordinator.create_token("ann"))
    bob = coordinator.client(coordinator.create_token("bob"))
    cy = coordinator.client(coordinator.create_token("cy"))
    with contextlib.ExitStack() as stack:
        first = _follow(stack, ann, waiting_job)
        assert first.status_code == 200 and _follow(stack, ann, waiting_job).status_code == 200
        with contextlib.ExitStack() as third:
            refused = _follow(third, ann, waiting_job)
            assert refused.status_code == 429
            assert "MWMS_MAX_FOLLOWS_PER_USER=2" in json.loads(refused.read())["detail"]
        assert _follow(stack, bob, waiting_job).status_code == 200
        with contextlib.ExitStack() as fourth:
            refused = _follow(fourth, cy, waiting_job)
            assert refused.status_code == 429
            assert "MWMS_MAX_FOLLOWS_TOTAL=3" in json.loads(refused.read())["detail"]
        # At the cap the API answers everything else, and pages of logs need no slot.
        page = cy.get(f"/api/v1/jobs/{waiting_job}/logs")
        assert page.status_code == 200 and page.json()["lines"] == []
        assert httpx.get(f"{coordinator.api}/healthz").status_code == 200
    # The clients went away: their slots are free again.
    wait_until(lambda: _can_follow(cy, waiting_job), 10, "a follow slot after the clients closed theirs")


def test_a_follow_of_a_job_that_never_ends_ends_when_idle(coordinator, waiting_job):
    started = time.monotonic()
    with coordinator.http.stream("GET", f"/api/v1/jobs/{waiting_job}/logs", params={"follow": "true"}) as r:
        assert r.status_code == 200
        assert list(r.iter_lines()) == []
    elapsed = time.monotonic() - started
    print(f"an idle follow ended after {elapsed:.1f} s (MWMS_FOLLOW_IDLE_TIMEOUT_S={IDLE_TIMEOUT_S})")
    assert IDLE_TIMEOUT_S - 1 <= elapsed <= IDLE_TIMEOUT_S + 10


def test_a_follow_ends_with_its_job_and_a_running_job_is_undisturbed(coordinator, waiting_job):
    program = "import time\nfor i in range(6):\n    print('line', i, flush=True)\n    time.sleep(0.5)\n"
    job_id = coordinator.submit({"talk.py": program}, ["python", "talk.py"], workers=1)
    texts = []
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        # Hold the other user slots while the job runs.
        dee = coordinator.client(coordinator.create_token("dee"))
        assert _follow(stack, dee, waiting_job).status_code == 200
        with coordinator.http.stream("GET", f"/api/v1/jobs/{job_id}/logs", params={"follow": "true"}) as r:
            assert r.status_code == 200
            texts = [json.loads(line)["text"] for line in r.iter_lines() if line]
    assert texts == [f"line {i}" for i in range(6)]
    assert time.monotonic() - started < IDLE_TIMEOUT_S + 20
    job = coordinator.job(job_id)
    assert job["state"] == "SUCCEEDED" and job["restarts"] == 0, job["reason"]
    assert coordinator.agent_online("follow-agent")


def test_cancelling_a_job_ends_its_follows(coordinator):
    digest = coordinator.upload(pack({"c.py": "print(1)"}))
    body = {
        "bundle_digest": digest,
        "command": ["python", "c.py"],
        "workers": 1,
        "agents": ["not-joined-yet"],
    }
    job_id = coordinator.http.post("/api/v1/jobs", json=body).json()["id"]
    with coordinator.http.stream("GET", f"/api/v1/jobs/{job_id}/logs", params={"follow": "true"}) as r:
        assert r.status_code == 200
        assert coordinator.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
        started = time.monotonic()
        assert list(r.iter_lines()) == []
    assert time.monotonic() - started < 6
