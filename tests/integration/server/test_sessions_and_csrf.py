"""Issue 16 items 9b and 9d on a real coordinator (REST in-process, SQLite): a dashboard session mints no
credentials (no second session, no API or join tokens) and logout ends it at once, whichever way it was
presented; a cookie request that changes something must come from the very origin it was sent to
(scheme, host and port), not merely the same host.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from mwms.server.api.auth import LOGIN_COOKIE, same_origin
from mwms.server.app import create_app
from mwms.server.db.models import Token
from mwms.server.services.auth.tokens import Role
from mwms.server.settings import Settings
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

ADMIN_TOKEN = "mwms_admin-token-for-session-tests-0123456"
ORIGIN = {"Origin": "http://127.0.0.1"}


class Coordinator(InProcessCoordinator):
    def log_in(self, token: str) -> str:
        """A dashboard session's secret, from the cookie of a log-in with `token`."""
        response = self.http.post("/api/v1/session", json={"token": token}, headers=ORIGIN)
        assert response.status_code == 200, response.text
        secret = response.cookies[LOGIN_COOKIE]
        self.http.cookies.clear()  # every request below says which credential it carries
        return secret

    def sessions(self) -> int:
        with self.db.read() as session:
            return session.scalar(select(func.count()).where(Token.kind == "session")) or 0


def cookie(secret: str) -> dict[str, str]:
    return {"Cookie": f"{LOGIN_COOKIE}={secret}", **ORIGIN}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    with ExitStack() as stack:
        yield Coordinator.start(
            stack, coordinator_settings(tmp_path / "coordinator", admin_token=ADMIN_TOKEN)
        )


# --- 9b: sessions mint nothing, logout ends them --------------------------------------------------------


def test_a_session_secret_cannot_open_another_session(coordinator: Coordinator) -> None:
    first = coordinator.log_in(coordinator.api_token("erin", Role.USER))
    assert coordinator.sessions() == 1
    for headers in ({}, cookie(first), bearer(first)):  # however the request itself is authenticated
        again = coordinator.http.post("/api/v1/session", json={"token": first}, headers={**ORIGIN, **headers})
        assert again.status_code == 403, again.text
        assert "may not create another session" in again.json()["detail"]
        assert "set-cookie" not in again.headers
    assert coordinator.sessions() == 1


def test_an_admins_session_creates_no_api_or_join_tokens(coordinator: Coordinator) -> None:
    secret = coordinator.log_in(ADMIN_TOKEN)
    with coordinator.db.read() as session:
        tokens_before = session.scalar(select(func.count()).select_from(Token))
    for headers in (cookie(secret), bearer(secret)):
        made = coordinator.http.post(
            "/api/v1/tokens", json={"user": "mallory", "role": "admin"}, headers=headers
        )
        assert made.status_code == 403, made.text
        assert "may not create API tokens or join tokens" in made.json()["detail"]
        joined = coordinator.http.post("/api/v1/agent-tokens", json={"name": "rack"}, headers=headers)
        assert joined.status_code == 403, joined.text
    with coordinator.db.read() as session:
        assert session.scalar(select(func.count()).select_from(Token)) == tokens_before
    # What the dashboard does with an admin session stays allowed: reading, and revoking.
    listed = coordinator.http.get("/api/v1/tokens", headers=cookie(secret))
    assert listed.status_code == 200
    victim = coordinator.http.post(
        "/api/v1/tokens", json={"user": "old", "role": "user"}, headers=bearer(ADMIN_TOKEN)
    )
    assert victim.status_code == 201
    revoked = coordinator.http.delete(f"/api/v1/tokens/{victim.json()['id']}", headers=cookie(secret))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]


@pytest.mark.parametrize("presented", ["cookie", "bearer"])
def test_logout_ends_the_session_at_once(coordinator: Coordinator, presented: str) -> None:
    secret = coordinator.log_in(coordinator.api_token("erin", Role.VIEWER))
    other = coordinator.log_in(coordinator.api_token("fred", Role.USER))
    headers = cookie(secret) if presented == "cookie" else bearer(secret)
    assert coordinator.http.get("/api/v1/whoami", headers=headers).json()["via_session"] is True

    out = coordinator.http.delete("/api/v1/session", headers=headers)
    assert out.status_code == 204, out.text
    assert f'{LOGIN_COOKIE}=""' in out.headers["set-cookie"] or "Max-Age=0" in out.headers["set-cookie"]
    for stale in (cookie(secret), bearer(secret)):
        refused = coordinator.http.get("/api/v1/jobs", headers=stale)
        assert refused.status_code == 401, refused.text
        assert "session has ended (logged out or expired): log in again" in refused.json()["detail"]
    assert coordinator.http.get("/api/v1/jobs", headers=cookie(other)).status_code == 200  # others live on


def test_logout_with_an_api_token_ends_only_the_cookies_session(coordinator: Coordinator) -> None:
    token = coordinator.api_token("gina", Role.USER)
    secret = coordinator.log_in(token)
    out = coordinator.http.delete(
        "/api/v1/session", headers={**bearer(token), "Cookie": f"{LOGIN_COOKIE}={secret}"}
    )
    assert out.status_code == 204
    assert coordinator.http.get("/api/v1/jobs", headers=cookie(secret)).status_code == 401
    assert coordinator.http.get("/api/v1/jobs", headers=bearer(token)).status_code == 200


# --- 9d: CSRF compares scheme, host and port ------------------------------------------------------------


def scope(scheme: str, host: str, **headers: str) -> dict[str, object]:
    raw = [(b"host", host.encode())] + [(k.encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "scheme": scheme, "headers": raw}


@pytest.mark.parametrize(
    ("scheme", "host", "origin", "same"),
    [
        ("http", "127.0.0.1:8080", "http://127.0.0.1:8080", True),
        ("https", "coord.example:8443", "https://coord.example:8443", True),
        ("https", "coord.example", "https://coord.example:443", True),
        ("http", "Coord.Example", "http://coord.example", True),
        ("http", "[::1]:8080", "http://[::1]:8080", True),
        ("https", "coord.example:8443", "http://coord.example:8443", False),  # the scheme differs
        ("http", "coord.example:8080", "https://coord.example:8080", False),
        ("https", "coord.example", "http://coord.example", False),
        ("http", "coord.example:8080", "http://coord.example:9090", False),  # the port differs
        ("http", "coord.example", "http://coord.example:8080", False),
        ("http", "coord.example", "http://evil.example", False),
        ("http", "coord.example", "http://coord.example.evil.example", False),
        ("http", "coord.example", "http://user@coord.example", False),
        ("http", "coord.example", "null", False),
        ("http", "coord.example", "ftp://coord.example", False),
        ("http", "coord.example", "", False),
    ],
)
def test_same_origin_compares_scheme_host_and_port(scheme: str, host: str, origin: str, same: bool) -> None:
    headers = {"origin": origin} if origin else {}
    assert same_origin(scope(scheme, host, **headers)) is same  # type: ignore[arg-type]
    if origin and origin != "null":  # a Referer counts the same when the Origin is missing
        assert same_origin(scope(scheme, host, referer=origin + "/#/jobs")) is same  # type: ignore[arg-type]


def test_a_cookie_request_from_the_http_origin_of_the_host_is_refused(coordinator: Coordinator) -> None:
    secret = coordinator.log_in(coordinator.api_token("hana", Role.USER))
    session_cookie = {"Cookie": f"{LOGIN_COOKIE}={secret}"}
    body = {"bundle_digest": "0" * 64, "command": ["python", "x.py"], "workers": 1}
    for origin in ("https://127.0.0.1", "http://127.0.0.1:8080", "https://127.0.0.1:80"):
        refused = coordinator.http.post(
            "/api/v1/jobs", json=body, headers={**session_cookie, "Origin": origin}
        )
        assert refused.status_code == 403, (origin, refused.text)
        assert "same scheme, host and port" in refused.json()["detail"]
    # From its own origin the request goes through the check (and is refused for its unknown bundle).
    accepted = coordinator.http.post("/api/v1/jobs", json=body, headers={**session_cookie, **ORIGIN})
    assert accepted.status_code == 404 and "unknown bundle digest" in accepted.json()["detail"]
    with_port = coordinator.http.post(
        "/api/v1/jobs", json=body, headers={**session_cookie, "Origin": "http://127.0.0.1:80"}
    )
    assert with_port.status_code == 404
    # Logging in from another scheme's page is refused too.
    login = coordinator.http.post(
        "/api/v1/session", json={"token": ADMIN_TOKEN}, headers={"Origin": "https://127.0.0.1"}
    )
    assert login.status_code == 403


def test_over_https_an_http_page_is_another_origin(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "coordinator", grpc_port=0, admin_token=ADMIN_TOKEN))
    with TestClient(app, base_url="https://127.0.0.1") as http:
        login = http.post(
            "/api/v1/session", json={"token": ADMIN_TOKEN}, headers={"Origin": "https://127.0.0.1"}
        )
        assert login.status_code == 200, login.text
        assert "secure" in login.headers["set-cookie"].lower()
        secret = login.cookies[LOGIN_COOKIE]
        http.cookies.clear()
        headers = {"Cookie": f"{LOGIN_COOKIE}={secret}"}
        made = {"name": "rack"}
        plain = http.post(
            "/api/v1/agent-tokens", json=made, headers={**headers, "Origin": "http://127.0.0.1"}
        )
        assert plain.status_code == 403 and "cross-site" in plain.json()["detail"]
        own = http.delete("/api/v1/session", headers={**headers, "Origin": "https://127.0.0.1"})
        assert own.status_code == 204
