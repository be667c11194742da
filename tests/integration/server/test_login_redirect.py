"""A browser without a login that opens a page of a real coordinator (in-process, SQLite) is sent to the
login page with the way back; programs keep their 401 in JSON; only same-origin relative paths are ways
back (server/api/login_redirect.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from mwms.server.api.login_redirect import MAX_NEXT_CHARS, safe_next
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

ADMIN_TOKEN = "mwms_admin-token-for-login-redirect-tests-0123"
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
NO_TOKEN = {"Authorization": ""}


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[InProcessCoordinator]:
    with ExitStack() as stack:
        yield InProcessCoordinator.start(
            stack,
            coordinator_settings(tmp_path / "coordinator", admin_token=ADMIN_TOKEN),
            admin_token=ADMIN_TOKEN,
        )


def get(coordinator: InProcessCoordinator, path: str, **headers: str):  # type: ignore[no-untyped-def]
    return coordinator.http.get(path, headers={**NO_TOKEN, **headers}, follow_redirects=False)


def test_a_browser_is_sent_to_log_in_with_the_way_back(coordinator: InProcessCoordinator) -> None:
    docs = get(coordinator, "/docs", **BROWSER)
    assert docs.status_code == 303 and docs.headers["location"] == "/?next=/docs"
    assert docs.headers["cache-control"] == "no-store"
    deep = get(coordinator, "/docs?tag=jobs", **BROWSER)
    assert deep.headers["location"] == "/?next=/docs%3Ftag%3Djobs"
    # A path that is no page: to the login, then the dashboard (not a 404 after logging in).
    unknown = get(coordinator, "/jobs/abc", **BROWSER)
    assert unknown.status_code == 303 and unknown.headers["location"] == "/"
    stale = get(coordinator, "/docs", Cookie="mwms_session=mwmss_ended", **BROWSER)
    assert stale.status_code == 303 and stale.headers["location"] == "/?next=/docs"
    # The login page itself is public: it shows the form.
    assert get(coordinator, "/", **BROWSER).status_code == 200


def test_programs_keep_their_401_in_json(coordinator: InProcessCoordinator) -> None:
    for path, headers in [
        ("/docs", {}),  # asks for anything
        ("/docs", {"Accept": "application/json"}),
        ("/docs", {**BROWSER, "Authorization": "Bearer mwms_not-a-token"}),
        ("/api/v1/jobs", BROWSER),
        ("/openapi.json", BROWSER),
        ("/jobs/abc", {}),
    ]:
        response = get(coordinator, path, **headers)
        assert response.status_code == 401, (path, headers, response.status_code)
        assert response.headers["content-type"] == "application/json" and response.json()["detail"]
    post = coordinator.http.post("/docs", headers={**NO_TOKEN, **BROWSER}, follow_redirects=False)
    assert post.status_code == 401


def test_only_same_origin_relative_paths_are_ways_back() -> None:
    assert safe_next("/docs", "a=1") == "/docs?a=1"
    for path in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "docs", "/", "/a\nb", ""):
        assert safe_next(path) is None, path
    assert safe_next("/" + "x" * MAX_NEXT_CHARS) is None


def test_a_refused_log_in_speaks_of_the_login_page(coordinator: InProcessCoordinator) -> None:
    created = coordinator.http.post(
        "/api/v1/tokens", json={"user": "eve", "role": "viewer", "expires_in_seconds": 1}
    )
    assert created.status_code in (200, 201), created.text
    expiring = created.json()["token"]
    refused = coordinator.http.post("/api/v1/session", json={"token": "mwms_not-a-token"}, headers=NO_TOKEN)
    assert refused.status_code == 401
    detail = refused.json()["detail"]
    assert detail.startswith("the token is unknown, revoked or expired. Paste a current token here;"), detail
    assert "mwms token create" in detail and "--token" not in detail and "MWMS_TOKEN" not in detail
    deadline = time.monotonic() + 10  # the token lives 1 s
    while True:
        expired = coordinator.http.post("/api/v1/session", json={"token": expiring}, headers=NO_TOKEN)
        if expired.status_code == 401 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert expired.status_code == 401, expired.text
    assert expired.json()["detail"].startswith("the token expired at "), expired.text
    assert "Paste a current token here" in expired.json()["detail"]
    # The API's own refusals keep their advice for programs.
    api = coordinator.http.get("/api/v1/jobs", headers={"Authorization": "Bearer mwms_not-a-token"})
    assert api.status_code == 401 and "--token" in api.json()["detail"]
