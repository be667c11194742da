"""Answers the OpenAPI document promises, from a real coordinator (REST in-process, SQLite): a 405 names
every method of its path, a body that is no JSON is a 422 like any invalid one, a browser that opens /docs
without a login is sent to log in, and the last admin token cannot be revoked."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from mwms.server.api.auth import LOGIN_COOKIE
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

ADMIN_TOKEN = "mwms_admin-token-for-openapi-tests-012345"
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[InProcessCoordinator]:
    with ExitStack() as stack:
        yield InProcessCoordinator.start(
            stack,
            coordinator_settings(tmp_path / "coordinator", admin_token=ADMIN_TOKEN),
            admin_token=ADMIN_TOKEN,
        )


def test_a_405_lists_every_method_of_the_path(coordinator: InProcessCoordinator) -> None:
    for method, path, allowed in [
        ("PUT", "/api/v1/tokens", "GET, POST"),
        ("HEAD", "/api/v1/jobs", "GET, POST"),
        ("GET", "/api/v1/session", "DELETE, POST"),
        ("OPTIONS", "/api/v1/teams/t/quota", "DELETE, PUT"),
        ("DELETE", "/api/v1/jobs/some-job/cancel", "POST"),
    ]:
        response = coordinator.http.request(method, path)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["allow"] == allowed, (method, path)
        if method != "HEAD":  # a HEAD answer has no body
            assert allowed in response.json()["detail"]


def test_a_body_that_is_not_json_is_a_422_in_the_documented_shape(coordinator: InProcessCoordinator) -> None:
    headers = {"Content-Type": "application/json"}
    for body in (b"\xff\xfe not utf-8", b"{not json"):
        response = coordinator.http.post("/api/v1/tokens", content=body, headers=headers)
        assert response.status_code == 422, response.text
        answer = response.json()
        assert "not valid JSON" in answer["detail"] and answer["errors"][0]["type"] == "json_invalid"


def test_a_browser_without_a_login_is_sent_from_docs_to_the_login_page(
    coordinator: InProcessCoordinator,
) -> None:
    http = coordinator.http
    redirected = http.get("/docs", headers={"Authorization": "", **BROWSER}, follow_redirects=False)
    assert redirected.status_code == 303 and redirected.headers["location"] == "/?next=/docs"
    stale = {"Authorization": "", "Cookie": f"{LOGIN_COOKIE}=mwmss_ended", **BROWSER}
    assert http.get("/docs", headers=stale, follow_redirects=False).status_code == 303
    # A tool that asks for anything gets the 401 that says how to authenticate.
    tool = http.get("/docs", headers={"Authorization": ""}, follow_redirects=False)
    assert tool.status_code == 401 and "Bearer" in tool.json()["detail"]
    assert http.get("/openapi.json", headers={"Authorization": "", **BROWSER}).status_code == 401
    assert http.get("/docs", headers=BROWSER).status_code == 200  # the bearer token
    login = http.post("/api/v1/session", json={"token": ADMIN_TOKEN}, headers={"Origin": "http://127.0.0.1"})
    secret = login.cookies[LOGIN_COOKIE]
    http.cookies.clear()
    by_cookie = {"Authorization": "", "Cookie": f"{LOGIN_COOKIE}={secret}", **BROWSER}
    assert http.get("/docs", headers=by_cookie).status_code == 200
    assert http.get("/openapi.json", headers=by_cookie).json()["components"]["securitySchemes"]


def test_the_last_admin_token_is_not_revoked(coordinator: InProcessCoordinator) -> None:
    http = coordinator.http
    [first] = [t for t in http.get("/api/v1/tokens").json() if t["role"] == "admin"]
    refused = http.delete(f"/api/v1/tokens/{first['id']}")
    assert refused.status_code == 409, refused.text
    assert "last usable admin token" in refused.json()["detail"]
    assert "mwms token create --user NAME --role admin" in refused.json()["detail"]
    second = http.post("/api/v1/tokens", json={"user": "root", "role": "admin"}).json()
    user = http.post("/api/v1/tokens", json={"user": "ann", "role": "user"}).json()
    assert http.delete(f"/api/v1/tokens/{first['id']}").status_code == 200  # another admin remains
    assert http.get("/api/v1/whoami").status_code == 401  # the revoked one is over at once
    http.headers["Authorization"] = f"Bearer {second['token']}"
    last = http.delete(f"/api/v1/tokens/{second['id']}")
    assert last.status_code == 409 and second["id"] in last.json()["detail"]
    assert http.delete(f"/api/v1/tokens/{user['id']}").status_code == 200  # other tokens as before
    assert http.get("/api/v1/whoami").json()["role"] == "admin"


def test_a_name_that_is_not_printable_is_a_422_that_says_so(coordinator: InProcessCoordinator) -> None:
    http = coordinator.http
    for path in ("/api/v1/teams/a%0Ab/members/bob", "/api/v1/teams/ml/members/%C2%AD"):
        refused = http.put(path)
        assert refused.status_code == 422, refused.text
        assert "printable characters" in refused.json()["detail"] and "\\u" not in refused.json()["detail"]
    created = http.post("/api/v1/tokens", json={"user": "ann\u200b", "role": "user"})
    assert created.status_code == 422 and "printable" in created.json()["detail"]
    assert http.put("/api/v1/teams/ml/members/bob").status_code == 200
