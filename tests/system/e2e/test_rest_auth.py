"""REST attacks against a real coordinator: every route refuses callers without a valid token or role."""

from __future__ import annotations

import re

import pytest

from mwms_testkit.cluster import pack, wait_until

pytestmark = pytest.mark.e2e

PUBLIC = {("get", "/healthz")}


def _routes(cluster) -> list[tuple[str, str]]:
    spec = cluster.http.get("/openapi.json").json()
    routes = [(method, path) for path, item in spec["paths"].items() for method in item]
    return routes + [("get", "/openapi.json"), ("get", "/docs"), ("get", "/metrics")]


def test_every_route_but_healthz_needs_a_token(cluster):
    anonymous = cluster.client(None)
    routes = _routes(cluster)
    assert len(routes) > 15
    for method, path in routes:
        if (method, path) in PUBLIC or (method, path) == ("post", "/api/v1/session"):
            continue
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        response = anonymous.request(method.upper(), concrete)
        assert response.status_code == 401, (method, path, response.status_code)
        assert "Bearer" in response.json()["detail"] and response.headers["www-authenticate"]
    assert anonymous.get("/healthz").status_code == 200
    assert cluster.client("mwms_not-a-real-token").get("/api/v1/jobs").status_code == 401


def test_roles_and_ownership(cluster):
    viewer = cluster.client(cluster.create_token("vera", "viewer"))
    alice = cluster.client(cluster.create_token("alice", "user"))
    bob = cluster.client(cluster.create_token("bob", "user"))
    digest = cluster.upload(pack({"idle.py": "import time; time.sleep(600)"}))
    body = {
        "bundle_digest": digest,
        "command": ["python", "idle.py"],
        "workers": 1,
        "agents": ["not-joined-yet"],
    }
    total = cluster.http.get("/api/v1/jobs").json()["total"]

    refused = viewer.post("/api/v1/jobs", json=body)
    assert refused.status_code == 403 and "mwms token create --role user" in refused.json()["detail"]
    upload = viewer.post("/api/v1/bundles", files={"file": ("b.tar.gz", pack({"x.py": "1"}))})
    assert upload.status_code == 403
    assert viewer.get("/api/v1/tokens").status_code == 403
    # The replicas list names every coordinator's hosts and ports: admins only.
    assert viewer.get("/api/v1/replicas").status_code == 403
    assert alice.get("/api/v1/replicas").status_code == 403
    assert cluster.http.get("/api/v1/replicas").status_code == 200
    assert alice.post("/api/v1/tokens", json={"user": "alice", "role": "admin"}).status_code == 403
    assert cluster.http.get("/api/v1/jobs").json()["total"] == total  # nothing was created

    created = alice.post("/api/v1/jobs", json=body)
    assert created.status_code == 201 and created.json()["submitted_by"] == "alice"
    job_id = created.json()["id"]
    assert viewer.get(f"/api/v1/jobs/{job_id}").json()["submitted_by"] == "alice"
    assert viewer.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 403
    other = bob.post(f"/api/v1/jobs/{job_id}/cancel")
    assert other.status_code == 403 and "submitted by 'alice'" in other.json()["detail"]
    assert cluster.job(job_id)["state"] == "PENDING"
    # Stack dumps pause a job's tasks: the same owner check, before anything else is looked at.
    stacks = bob.post(f"/api/v1/jobs/{job_id}/stacks")
    assert stacks.status_code == 403 and "may dump its stacks" in stacks.json()["detail"]
    assert alice.post(f"/api/v1/jobs/{job_id}/stacks").status_code == 409  # hers, but nothing runs

    own = alice.post("/api/v1/jobs", json=body).json()["id"]
    cancelled = alice.post(f"/api/v1/jobs/{own}/cancel").json()
    assert cancelled["cancelled_by"] == "alice" and "cancelled by alice" in cancelled["reason"]
    by_admin = cluster.http.post(f"/api/v1/jobs/{job_id}/cancel").json()
    assert by_admin["state"] == "CANCELLED" and by_admin["cancelled_by"] == "admin"


def test_revoked_and_expired_tokens_are_refused(cluster):
    made = cluster.http.post("/api/v1/tokens", json={"user": "carl", "role": "user"}).json()
    carl = cluster.client(made["token"])
    assert carl.get("/api/v1/whoami").json() == {
        "user": "carl",
        "role": "user",
        "token_name": "carl",
        "via_session": False,
    }
    listed = cluster.http.get("/api/v1/tokens").json()
    assert all("token" not in t and made["token"] not in str(t) for t in listed)
    assert cluster.http.delete(f"/api/v1/tokens/{made['id']}").json()["revoked_at"]
    assert carl.get("/api/v1/jobs").status_code == 401

    short = cluster.http.post(
        "/api/v1/tokens", json={"user": "dora", "role": "viewer", "expires_in_seconds": 1}
    ).json()
    dora = cluster.client(short["token"])
    wait_until(lambda: dora.get("/api/v1/jobs").status_code == 401, 10, "the token to expire")
    assert len(made["token"]) >= 43  # 32 random bytes, URL-safe


def test_dashboard_session_cookie_and_csrf(cluster):
    secret = cluster.create_token("erin", "user")
    browser = cluster.client(None)
    login = browser.post("/api/v1/session", json={"token": secret})
    assert login.status_code == 200 and login.json()["via_session"] is False
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert secret not in cookie
    assert browser.get("/api/v1/whoami").json()["via_session"] is True

    digest = cluster.upload(pack({"idle.py": "import time; time.sleep(600)"}))
    body = {
        "bundle_digest": digest,
        "command": ["python", "idle.py"],
        "workers": 1,
        "agents": ["not-joined-yet"],
    }
    origin = {"Origin": cluster.api}
    assert browser.post("/api/v1/jobs", json=body).status_code == 403  # no Origin
    assert (
        browser.post("/api/v1/jobs", json=body, headers={"Origin": "https://evil.example"}).status_code == 403
    )
    job_id = browser.post("/api/v1/jobs", json=body, headers=origin).json()["id"]
    assert browser.post(f"/api/v1/jobs/{job_id}/cancel", headers=origin).json()["cancelled_by"] == "erin"

    # The same host over the other scheme is another origin.
    other_scheme = cluster.api.replace("http://", "https://", 1)
    assert browser.post("/api/v1/jobs", json=body, headers={"Origin": other_scheme}).status_code == 403
    # A session mints no credentials: no second session, no tokens.
    session_secret = login.cookies["mwms_session"]
    minted = cluster.client(None).post("/api/v1/session", json={"token": session_secret})
    assert minted.status_code == 403 and "may not create another session" in minted.json()["detail"]
    admin_browser = cluster.client(None)
    assert admin_browser.post("/api/v1/session", json={"token": cluster.admin_token}).status_code == 200
    for path, made in (
        ("/api/v1/tokens", {"user": "mallory", "role": "admin"}),
        ("/api/v1/agent-tokens", {}),
    ):
        refused = admin_browser.post(path, json=made, headers=origin)
        assert refused.status_code == 403 and "may not create API tokens" in refused.json()["detail"], path
    assert admin_browser.get("/api/v1/tokens").status_code == 200  # the admin's session still reads them

    assert browser.delete("/api/v1/session", headers=origin).status_code == 204
    stale = cluster.client(None)
    stale.cookies.set("mwms_session", session_secret)
    assert stale.get("/api/v1/jobs").status_code == 401
    assert cluster.client(session_secret).get("/api/v1/jobs").status_code == 401  # as a bearer too

    # A session ends with the token that opened it.
    again = cluster.client(None)
    again.post("/api/v1/session", json={"token": secret})
    assert again.get("/api/v1/jobs").status_code == 200
    token_id = next(t["id"] for t in cluster.http.get("/api/v1/tokens").json() if t["user"] == "erin")
    cluster.http.delete(f"/api/v1/tokens/{token_id}")
    assert again.get("/api/v1/jobs").status_code == 401
    assert cluster.client(None).post("/api/v1/session", json={"token": "wrong"}).status_code == 401


def test_join_tokens_are_admin_only_and_never_listed_with_secrets(cluster):
    viewer = cluster.client(cluster.create_token("fred", "user"))
    assert viewer.post("/api/v1/agent-tokens", json={"name": "rack-1"}).status_code == 403
    made = cluster.http.post("/api/v1/agent-tokens", json={"name": "rack-1"})
    assert made.status_code == 201 and made.json()["token"].startswith("mwmsj_")
    listed = cluster.http.get("/api/v1/agent-tokens").json()
    assert [t["name"] for t in listed if t["id"] == made.json()["id"]] == ["rack-1"]
    assert made.json()["token"] not in str(listed)
    assert cluster.http.delete(f"/api/v1/agent-tokens/{made.json()['id']}").json()["revoked_at"]


def test_security_headers_on_every_response(cluster):
    for client, path in [
        (cluster.http, "/docs"),
        (cluster.http, "/openapi.json"),
        (cluster.http, "/api/v1/jobs/nope"),
        (cluster.client(None), "/api/v1/jobs"),
        (cluster.client(None), "/"),
        (cluster.client(None), "/healthz"),
    ]:
        headers = client.get(path).headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"], path
        assert headers["x-content-type-options"] == "nosniff", path
    docs = cluster.http.get("/docs").text
    assert "<script>" not in docs  # the CSP allows no inline script: Swagger UI starts from a file


def test_foreign_host_header_is_refused(cluster):
    response = cluster.client(cluster.admin_token).get("/api/v1/jobs", headers={"Host": "attacker.example"})
    assert response.status_code == 400


def test_whoami_tells_the_role(cluster):
    assert cluster.http.get("/api/v1/whoami").json()["role"] == "admin"
