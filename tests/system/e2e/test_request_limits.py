"""Request limits against the real coordinator: every over-limit request gets a 413 or 422 that names the
limit and its MWMS_* variable, costs the coordinator next to nothing, and leaves a running job alone."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from mwms_testkit.cluster import pack

# Bounds latencies: under pytest-xdist it runs while no other test does (tests/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.alone]
MiB = 1024 * 1024
# Runs through every probe in this module; it must end SUCCEEDED, with its agents online throughout.
STEADY_JOB = "import time\nfor i in range(20):\n    print('step', i, flush=True)\n    time.sleep(0.5)\n"


@pytest.fixture(scope="module")
def steady_job(cluster):
    job_id = cluster.submit({"steady.py": STEADY_JOB}, ["python", "steady.py"], workers=2)
    cluster.wait_for(job_id, {"RUNNING"}, timeout=60)
    return job_id


@pytest.fixture(scope="module")
def digest(cluster):
    return cluster.upload(pack({"a.py": "print(1)"}))


def _rss_mib(cluster) -> float:
    status = open(f"/proc/{cluster.server.popen.pid}/status").read()
    return int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1]) / 1024


def _post_job(cluster, body: dict | bytes):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return cluster.http.post("/api/v1/jobs", content=content, headers={"content-type": "application/json"})


def _assert_refused(response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    for word in words:
        assert word in body["detail"], body["detail"]
    if status == 422:
        assert body["errors"] and all({"loc", "msg", "type"} <= set(e) for e in body["errors"])
    return body


def test_a_body_over_the_limit_is_refused_before_it_is_read(cluster, steady_job):
    before = _rss_mib(cluster)
    body = b'{"env": {"A": "' + b"x" * (200 * MiB) + b'"}}'
    started = time.monotonic()
    response = _post_job(cluster, body)
    elapsed = time.monotonic() - started
    _assert_refused(response, 413, "MWMS_MAX_REQUEST_BODY_BYTES", "1048576 bytes")
    grown = _rss_mib(cluster) - before
    print(f"200 MB body refused in {elapsed:.2f} s; coordinator RSS {before:.0f} MiB, +{grown:.1f} MiB")
    assert elapsed < 5 and grown < 20


def test_a_body_without_length_is_cut_off_at_the_limit(cluster, steady_job):
    sent = []

    def chunks() -> Iterator[bytes]:
        yield b'{"env": {"A": "'
        for _ in range(200):
            sent.append(MiB)
            yield b"x" * MiB
        yield b'"}}'

    before = _rss_mib(cluster)
    response = cluster.http.post(
        "/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    _assert_refused(response, 413, "MWMS_MAX_REQUEST_BODY_BYTES")
    assert _rss_mib(cluster) - before < 20


def test_a_body_at_the_limit_is_read(cluster, digest):
    spec = {"bundle_digest": digest, "command": ["python", "a.py"], "workers": 1, "name": "padded"}
    text = json.dumps(spec).encode()
    body = text[:-1] + b" " * (MiB - len(text)) + b"}"  # exactly the limit
    assert len(body) == MiB
    response = _post_job(cluster, body)
    assert response.status_code == 201, response.text[:300]
    cluster.http.post(f"/api/v1/jobs/{response.json()['id']}/cancel")


@pytest.mark.parametrize(
    ("spec", "limit"),
    [
        ({"env": {f"V{i}": "x" for i in range(1001)}}, "MWMS_MAX_ENV_VARS"),
        ({"env": {"N" * 257: "x"}}, "MWMS_MAX_ENV_NAME_BYTES"),
        ({"env": {"BIG": "x" * (64 * 1024 + 1)}}, "MWMS_MAX_ENV_VALUE_BYTES"),
        ({"env": {f"V{i}": "x" * 60_000 for i in range(5)}}, "MWMS_MAX_ENV_TOTAL_BYTES"),
        ({"command": ["python"] + ["a"] * 1000}, "MWMS_MAX_COMMAND_ARGS"),
        ({"command": ["python"] + ["a" * 100_000] * 3}, "MWMS_MAX_COMMAND_BYTES"),
        ({"command": ["python", "a" * (128 * 1024)]}, "Linux runs no program"),
        ({"startup_timeout_seconds": 1e308}, "MWMS_MAX_TIMEOUT_SECONDS"),
        ({"max_runtime_seconds": 31 * 86400}, "MWMS_MAX_TIMEOUT_SECONDS"),
        ({"communication": {"timeout_seconds": 1e300}}, "MWMS_MAX_TIMEOUT_SECONDS"),
        ({"name": "n" * 201}, "200 characters"),
        ({"command": ["python", "a\x00b"]}, "NUL"),
        ({"env": {"A": "a\x00b"}}, "NUL"),
        ({"communication": {"bytes_per_pack": 2**63}}, "9223372036854775807"),
    ],
    ids=lambda value: value if isinstance(value, str) else next(iter(value)),
)
def test_a_spec_over_a_limit_gets_a_422_naming_it(cluster, steady_job, digest, spec, limit):
    body = {"bundle_digest": digest, "command": ["python", "a.py"], "workers": 1, **spec}
    _assert_refused(_post_job(cluster, body), 422, limit)


@pytest.mark.parametrize(
    "field",
    ['"startup_timeout_seconds": Infinity', '"max_runtime_seconds": NaN', '"max_runtime_seconds": -Infinity'],
)
def test_a_timeout_that_is_not_finite_gets_a_422_naming_the_limit(cluster, steady_job, digest, field):
    body = f'{{"bundle_digest": "{digest}", "command": ["python"], "workers": 1, {field}}}'
    _assert_refused(_post_job(cluster, body.encode()), 422, "finite", "MWMS_MAX_TIMEOUT_SECONDS")


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/api/v1/jobs", "offset"),
        ("{job}/logs", "after"),
        ("{job}/logs", "attempt"),
        ("{job}/logs", "task"),
        ("{job}/logs", "tail"),
        ("{job}/metrics", "min_step"),
        ("{job}/metrics", "max_step"),
        ("{job}/metrics", "attempt"),
        ("{job}/artifacts/x.txt", "attempt"),
    ],
)
def test_integer_parameters_past_int64_get_a_422_naming_the_bound(cluster, steady_job, path, param):
    url = path.replace("{job}", f"/api/v1/jobs/{steady_job}")
    for value in (2**63, 10**30, -(2**63) - 1):
        response = cluster.http.get(url, params={param: value})
        body = _assert_refused(response, 422, param)
        assert any(e["loc"] == ["query", param] for e in body["errors"])


def test_integer_parameters_at_int64_are_answered(cluster, steady_job):
    job = f"/api/v1/jobs/{steady_job}"
    assert cluster.http.get("/api/v1/jobs", params={"offset": 2**63 - 1}).json()["jobs"] == []
    assert cluster.http.get(f"{job}/logs", params={"after": 2**63 - 1}).json()["lines"] == []
    points = cluster.http.get(f"{job}/metrics", params={"min_step": -(2**63), "max_step": 2**63 - 1})
    assert points.status_code == 200


def test_the_job_running_through_the_probes_succeeds(cluster, steady_job):
    """The last test of the module: no probe changed another job's fate or its agents' liveness."""
    job = cluster.wait_for(steady_job, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["restarts"] == 0
    assert cluster.agent_online("e2e-1") and cluster.agent_online("e2e-2")
    after = cluster.submit({"b.py": "print('after the probes')"}, ["python", "b.py"], workers=2)
    assert cluster.wait_for(after, {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "SUCCEEDED"
