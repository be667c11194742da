"""Who may call the REST API: one middleware in front of every route, and the dependencies routes use.

Every request needs an API token (`Authorization: Bearer ...`) or a dashboard login cookie, except the
few public paths listed here. Safe methods need the viewer role, every other method the user role, unless
a route asks for more (`AdminOnly`). Requests that authenticate with the cookie and change something must
come from the dashboard's own origin (CSRF).
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from mwms.server.api.errors import error_content
from mwms.server.api.login_redirect import login_location, wants_login_page
from mwms.server.errors import Forbidden, Unauthenticated
from mwms.server.services.auth.tokens import Principal, Role, authenticate, check_may_mint

LOGIN_COOKIE = "mwms_session"  # the dashboard login's cookie; the name is the HTTP contract
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Paths anyone may call: liveness, the dashboard's static shell (it shows the login form), logging in.
PUBLIC_EXACT = frozenset(
    {("GET", "/healthz"), ("HEAD", "/healthz"), ("GET", "/"), ("POST", "/api/v1/session")}
)
PUBLIC_PREFIXES = ("/static/",)
DOCS_PATH = "/docs"  # Swagger UI (server/app.py)
# Non-safe requests that a viewer may make: logging out.
VIEWER_WRITES = frozenset({("DELETE", "/api/v1/session")})
CROSS_SITE_REFUSED = (
    "cross-site request refused: the dashboard's requests must come from its own page (the same scheme, "
    "host and port; behind a proxy that ends TLS, have it send X-Forwarded-Proto)"
)
UNAUTHENTICATED_HELP = (
    "authentication required: send an API token as 'Authorization: Bearer <token>' (the CLI takes "
    "--token, MWMS_TOKEN or `mwms login`), or log in to the dashboard; the coordinator wrote its first "
    "admin token to <data dir>/admin-token"
)


def is_public(method: str, path: str) -> bool:
    return (method, path) in PUBLIC_EXACT or (method in SAFE_METHODS and path.startswith(PUBLIC_PREFIXES))


def required_role(method: str, path: str) -> Role:
    """The least role for a request; routes may demand more with a dependency."""
    if method in SAFE_METHODS or (method, path) in VIEWER_WRITES:
        return Role.VIEWER
    return Role.USER


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""


def _cookie(scope: Scope, name: str) -> str:
    for part in _header(scope, b"cookie").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


def bearer_token(scope: Scope) -> str:
    scheme, _, value = _header(scope, b"authorization").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in; None when it cannot be read."""
    scheme = scheme.lower()
    if scheme not in _DEFAULT_PORTS or not netloc or "@" in netloc:
        return None
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def same_origin(scope: Scope) -> bool:
    """True when the request's Origin (or, lacking one, Referer) is the origin it was sent to: the same
    scheme, host and port. A page served over http may not act on the https dashboard (nor the reverse):
    its scripts are whatever the network between put there."""
    claimed = _header(scope, b"origin") or _header(scope, b"referer")
    if not claimed or claimed == "null":
        return False
    try:
        parts = urlsplit(claimed)
    except ValueError:
        return False
    theirs = _origin_of(parts.scheme, parts.netloc)
    ours = _origin_of(str(scope.get("scheme", "")), _header(scope, b"host"))
    return theirs is not None and theirs == ours


async def _refuse(send: Send, status: int, detail: str | dict[str, Any]) -> None:
    body = json.dumps(detail if isinstance(detail, dict) else {"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="mwms"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse_unauthenticated(scope: Scope, send: Send, detail: str | dict[str, Any]) -> None:
    # A browser opening a page (/docs, a path that does not exist) goes to log in, with the way back, since
    # a 401 in JSON tells a person nothing (server/api/login_redirect.py).
    if not wants_login_page(scope):
        await _refuse(send, 401, detail)
        return
    location = login_location(scope).encode("latin-1")
    headers = [(b"location", location), (b"content-length", b"0"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


class AuthMiddleware:
    """Authenticates every HTTP request but the public ones and applies the role that its method needs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if is_public(method, path):
            await self.app(scope, receive, send)
            return
        secret = bearer_token(scope)
        via_cookie = False
        if not secret:
            secret = _cookie(scope, LOGIN_COOKIE)
            via_cookie = bool(secret)
        if not secret:
            await _refuse_unauthenticated(scope, send, UNAUTHENTICATED_HELP)
            return
        wiring = scope["app"].state.wiring
        try:
            principal = await asyncio.to_thread(_authenticate, wiring, secret)
        except Unauthenticated as error:
            await _refuse_unauthenticated(scope, send, error_content(error))
            return
        if via_cookie and method not in SAFE_METHODS and not same_origin(scope):
            await _refuse(send, 403, CROSS_SITE_REFUSED)
            return
        needed = required_role(method, path)
        if not principal.may(needed):
            await _refuse(send, 403, forbidden_message(principal, needed))
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def _authenticate(wiring: Any, secret: str) -> Principal:
    with wiring.db.read() as session:
        return authenticate(session, secret)


def forbidden_message(principal: Principal, needed: Role) -> str:
    return (
        f"the {principal.role.label} role of {principal.user!r} may not do this; it needs the "
        f"{needed.label} role: ask an admin for such a token (mwms token create --role {needed.label})"
    )


def current_principal(request: Request) -> Principal:
    """The caller the middleware authenticated."""
    principal = request.state.principal if hasattr(request.state, "principal") else None
    if principal is None:  # a public route asked for a caller: a wiring mistake, never allow it
        raise Unauthenticated(UNAUTHENTICATED_HELP)
    return principal


def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.may(Role.ADMIN):
        raise Forbidden(forbidden_message(principal, Role.ADMIN))
    return principal


def require_admin_token(principal: Annotated[Principal, Depends(require_admin)]) -> Principal:
    """An admin calling with an API token, not a dashboard login: for routes that mint credentials."""
    check_may_mint(principal, "API tokens or join tokens")
    return principal


Caller = Annotated[Principal, Depends(current_principal)]
AdminOnly = Annotated[Principal, Depends(require_admin)]
# Creating credentials: an admin API token only; a login's would outlive the login (services.auth.tokens).
AdminTokenOnly = Annotated[Principal, Depends(require_admin_token)]
