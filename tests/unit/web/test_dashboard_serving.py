"""The dashboard router (behind the security-headers middleware, as in the coordinator): index and static
files, security headers, path traversal, no markup built from data, and the login shell's wiring."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from mwms.server.api import dashboard
from mwms.server.api.security_headers import SecurityHeadersMiddleware

WEB = Path(dashboard.__file__).resolve().parents[2] / "web"


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    app.include_router(dashboard.router)
    app.add_middleware(SecurityHeadersMiddleware)
    return TestClient(app)


def assert_security_headers(response) -> None:
    csp = response.headers["content-security-policy"]
    for directive in (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "connect-src 'self'",
    ):
        assert directive in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"] == "no-cache"


def test_index_is_served_with_security_headers(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/js/app.js">' in response.text
    assert_security_headers(response)


@pytest.mark.parametrize(
    ("path", "media_type"),
    [("js/app.js", "text/javascript"), ("style.css", "text/css"), ("favicon.svg", "image/svg+xml")],
)
def test_static_files_have_their_media_type(client: TestClient, path: str, media_type: str) -> None:
    response = client.get(f"/static/{path}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(media_type)
    assert response.content == (WEB / path).read_bytes()
    assert_security_headers(response)


@pytest.mark.parametrize(
    "path",
    [
        "/static/..%2fpyproject.toml",
        "/static/%2e%2e/%2e%2e/pyproject.toml",
        "/static/js/..%2f..%2fserver%2fsettings.py",
        "/static/%2fetc%2fpasswd",
        "/static//etc/passwd",
        "/static/.hidden",
        "/static/js/",
        "/static/missing.js",
    ],
)
def test_paths_outside_web_or_missing_are_404(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert "[project]" not in response.text and "root:" not in response.text
    assert_security_headers(response)


def test_resolve_static_path_refuses_symlinks_out_of_the_web_dir(tmp_path: Path) -> None:
    web = tmp_path / "web"
    web.mkdir()
    (web / "ok.js").write_text("export {};")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (web / "link.txt").symlink_to(secret)
    assert dashboard.resolve_static_path(web, "ok.js") == (web / "ok.js").resolve()
    assert dashboard.resolve_static_path(web, "link.txt") is None
    assert dashboard.resolve_static_path(web, "../secret.txt") is None
    assert dashboard.resolve_static_path(web, "ok.js\x00.png") is None
    assert dashboard.resolve_static_path(web, "") is None


def test_web_sources_never_build_markup_from_strings() -> None:
    """Data reaches the page only as text: no innerHTML and friends, no inline scripts, styles or handlers."""
    forbidden = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function")
    for path in WEB.rglob("*.js"):
        if "vendor" in path.parts:
            continue
        code = [line for line in path.read_text().splitlines() if not line.strip().startswith("//")]
        hits = [line for line in code if forbidden.search(line)]
        assert not hits, f"{path.relative_to(WEB)} builds markup from strings: {hits}"
    index = (WEB / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", index), "inline <script> is blocked by the CSP"
    assert not re.search(r"<style|\sstyle=|\son[a-z]+=", index), (
        "inline styles and handlers are blocked by the CSP"
    )


def test_the_token_never_reaches_browser_storage() -> None:
    """The login form posts the token once; the session lives in an HttpOnly cookie the scripts cannot read."""
    for path in WEB.rglob("*.js"):
        if "vendor" in path.parts:
            continue
        text = path.read_text()
        assert not re.search(r"localStorage|sessionStorage|indexedDB|document\.cookie", text), (
            f"{path.relative_to(WEB)} touches browser storage"
        )
