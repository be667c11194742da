"""Where a browser without a login is sent: the dashboard's login page, with the way back.

A person who opens a page of the coordinator before logging in (the API docs at /docs, an old bookmark, a
mistyped path) is sent to the login form with a 303 to `/?next=<the path asked for>` (to `/` alone for a
path that is no page: after logging in they see the dashboard, not a 404); once logged in, the dashboard
goes back there (web/js/login.js). Only a same-origin relative path is ever a way back: the
coordinator writes `next` from the request's own path, and the page checks it again before following it,
so `/?next=https://elsewhere` sends nobody away (no open redirect).

Programs keep the 401 in JSON that says how to authenticate: anything that sends an Authorization header,
does not ask for HTML (the dashboard's own fetches ask for JSON), or asks for the API's paths and its
OpenAPI document.
"""

from __future__ import annotations

from urllib.parse import quote

from starlette.routing import Match
from starlette.types import Scope

LOGIN_PAGE = "/"  # the dashboard shows its login form until a login exists
NEXT_PARAM = "next"
MAX_NEXT_CHARS = 2048  # a longer way back is dropped: the login page opens without one
_MACHINE_PATHS = ("/api/", "/openapi.json", "/metrics", "/healthz")


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""


def wants_login_page(scope: Scope) -> bool:
    """A browser opening a page (GET or HEAD, asking for HTML, no Authorization header) outside the API."""
    path = scope.get("path", "")
    return (
        scope.get("method") in ("GET", "HEAD")
        and "text/html" in _header(scope, b"accept")
        and not _header(scope, b"authorization").strip()
        and not path.startswith(_MACHINE_PATHS)
    )


def safe_next(path: str, query: str = "") -> str | None:
    """The way back to `path` (and its query) as a same-origin relative path, or None when it is not one
    (not absolute, `//host` or `/\\host` that a browser reads as another origin, control characters) or
    too long."""
    if not path.startswith("/") or path.startswith(("//", "/\\")) or path == LOGIN_PAGE:
        return None
    target = path + (f"?{query}" if query else "")
    if len(target) > MAX_NEXT_CHARS or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return None
    return target


def _is_page(scope: Scope) -> bool:
    """Whether the app has a GET route for the path asked for: only a page that exists is a way back, so
    a mistyped path leads to the login and then the dashboard, not to a 404 after logging in."""
    router = getattr(scope.get("app"), "router", None)
    probe = {**scope, "type": "http", "method": "GET"}
    return any(route.matches(probe)[0] == Match.FULL for route in getattr(router, "routes", ()))


def login_location(scope: Scope) -> str:
    """The login page's address, with `next` naming the page asked for when it exists and is a safe way
    back."""
    query = scope.get("query_string", b"").decode("latin-1")
    back = safe_next(scope.get("path", ""), query) if _is_page(scope) else None
    return LOGIN_PAGE if back is None else f"{LOGIN_PAGE}?{NEXT_PARAM}={quote(back, safe='/')}"
