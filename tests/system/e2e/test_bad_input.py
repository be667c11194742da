"""Bad input gets a clear 4xx and loses nothing."""

from __future__ import annotations

import io
import zipfile

import pytest

from mwms_testkit.cluster import pack

pytestmark = pytest.mark.e2e


def test_malformed_json(cluster):
    response = cluster.http.post(
        "/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"]


def test_workers_below_one(cluster):
    digest = cluster.upload(pack({"a.py": "print(1)"}))
    response = cluster.http.post(
        "/api/v1/jobs", json={"bundle_digest": digest, "command": ["python"], "workers": 0}
    )
    assert response.status_code == 422
    assert "workers" in response.json()["detail"]


def test_unknown_bundle_digest(cluster):
    response = cluster.http.post(
        "/api/v1/jobs", json={"bundle_digest": "0" * 64, "command": ["python"], "workers": 1}
    )
    assert response.status_code == 404  # like every unknown resource
    assert (
        "unknown bundle digest" in response.json()["detail"]
        and "POST /api/v1/bundles" in response.json()["detail"]
    )


def test_unknown_fields_and_reserved_env_are_refused(cluster):
    digest = cluster.upload(pack({"a.py": "print(1)"}))
    body = {"bundle_digest": digest, "command": ["python"], "workers": 1, "wrokers": 2}
    assert cluster.http.post("/api/v1/jobs", json=body).status_code == 422
    body = {"bundle_digest": digest, "command": ["python"], "workers": 1, "env": {"TF_CONFIG": "{}"}}
    response = cluster.http.post("/api/v1/jobs", json=body)
    assert response.status_code == 422 and "set by mwms" in response.json()["detail"]
    # What the agent overwrites is refused too (it was once accepted and silently replaced), all named at once.
    body["env"] = {"TMPDIR": "/scratch", "PYTHONUNBUFFERED": "0", "MY_SETTING": "1"}
    response = cluster.http.post("/api/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    assert "PYTHONUNBUFFERED, TMPDIR are set by mwms for each task" in response.json()["detail"]


def test_unknown_job_ids(cluster):
    for method, path in [
        ("GET", "/api/v1/jobs/nope"),
        ("POST", "/api/v1/jobs/nope/cancel"),
        ("GET", "/api/v1/jobs/nope/logs"),
        ("GET", "/api/v1/jobs/nope/metrics"),
    ]:
        response = cluster.http.request(method, path)
        assert response.status_code == 404, path
        assert "no job with id nope" in response.json()["detail"]


def test_empty_and_non_archive_bundles(cluster):
    for payload, expected in [
        (b"", "empty"),
        (b"hello world", "not a .tar.gz or .zip"),
        (pack({}), "holds no files"),
    ]:
        response = cluster.http.post("/api/v1/bundles", files={"file": ("b.tar.gz", payload)})
        assert response.status_code == 400, payload
        assert expected in response.json()["detail"]


def test_same_content_is_stored_once(cluster):
    bundle = pack({"same.py": "print('same')"})
    first = cluster.http.post("/api/v1/bundles", files={"file": ("b.tar.gz", bundle)})
    second = cluster.http.post("/api/v1/bundles", files={"file": ("b.tar.gz", bundle)})
    assert first.json()["digest"] == second.json()["digest"]
    assert second.status_code == 200 and second.json()["created"] is False


def test_zip_bundle_is_accepted(cluster):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("main.py", "print('zip ok')")
    response = cluster.http.post("/api/v1/bundles", files={"file": ("b.zip", buffer.getvalue())})
    assert response.status_code in (200, 201) and response.json()["format"] == "zip"


def test_logs_of_a_task_or_attempt_the_job_does_not_have(cluster):
    digest = cluster.upload(pack({"a.py": "print(1)"}))
    job_id = cluster.http.post(
        "/api/v1/jobs",
        json={
            "bundle_digest": digest,
            "command": ["python", "a.py"],
            "workers": 1,
            "agents": ["not-joined-yet"],
        },
    ).json()["id"]
    response = cluster.http.get(f"/api/v1/jobs/{job_id}/logs", params={"task": 5})
    assert response.status_code == 404 and "has tasks 0-0" in response.json()["detail"]
    response = cluster.http.get(f"/api/v1/jobs/{job_id}/logs", params={"attempt": 3})
    assert response.status_code == 404 and "no attempt 3" in response.json()["detail"]
    cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")


def test_api_docs_are_served_without_internet(cluster):
    page = cluster.http.get("/docs").text
    assert "cdn.jsdelivr" not in page and "/static/vendor/swagger-ui-5.35.0/swagger-ui-bundle.js" in page
    script = cluster.http.get("/static/vendor/swagger-ui-5.35.0/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 100_000
    assert cluster.http.get("/openapi.json").json()["info"]["title"] == "mwms coordinator"
