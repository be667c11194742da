"""Who may call the fake API: a small copy of the coordinator's rules (server/api/auth.py).

Every /api/ route but logging in wants `Authorization: Bearer <token>` or a login cookie: 401 without a known,
unrevoked one; 403 when the caller's role is too low (GET: viewer, other methods: user; tokens and removing
agents: admin), for a write with the cookie alone from a foreign origin, or (cancel) for someone else's job.
Also here: log-in and log-out, whoami, API tokens and join tokens.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from mwms.server.schemas import JoinTokenCreate, LoginRequest, TokenCreate, TokenCreated, TokenOut, WhoAmI
from mwms_testkit.fake_api.fake_job import _iso, now
from mwms_testkit.fake_api.state import ROLE_RANK, FakeState, expiry

SESSION_COOKIE = "mwms_session"
router = APIRouter(prefix="/api/v1")


def fake_state(request: Request) -> FakeState:
    return request.app.state.fake


State = Annotated[FakeState, Depends(fake_state)]


def _needed_role(method: str, path: str) -> str:
    if path.startswith(("/api/v1/tokens", "/api/v1/agent-tokens")) or (
        method == "DELETE" and path.startswith("/api/v1/agents/")
    ):
        return "admin"
    reads = method in {"GET", "HEAD"} or (method, path) == ("DELETE", "/api/v1/session")
    return "viewer" if reads else "user"


def _refusal(state: FakeState, request: Request) -> tuple[int, str] | None:
    """Why the request may not go on (status, detail); None: it may, as request.state.token."""
    header = request.headers.get("authorization", "")
    state.authorization_headers.append(header)
    scheme, _, secret = header.partition(" ")
    if scheme.lower() == "bearer":
        token = state.tokens.get(secret.strip())
    else:
        token = state.sessions.get(request.cookies.get(SESSION_COOKIE, ""))
    if token is None or token["revoked_at"]:
        return 401, "authentication required: send an API token"
    origin = request.headers.get("origin", "")
    foreign = origin.split("://", 1)[-1] != request.headers.get("host")
    if request.method not in ("GET", "HEAD") and not header and foreign:
        return 403, "cross-site request refused (fake)"
    needed = _needed_role(request.method, request.url.path)
    if ROLE_RANK[token["role"]] < ROLE_RANK[needed]:
        role, user = token["role"], token["user"]
        return 403, f"the {role} role of {user!r} may not do this; it needs the {needed} role"
    request.state.token = token
    return None


async def authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """The middleware: the switches that take the API down, then the rules above."""
    state: FakeState = request.app.state.fake
    path = request.url.path
    if not path.startswith("/api/"):
        return await call_next(request)
    if state.unreachable:
        return PlainTextResponse("coordinator down", status_code=503)
    if state.server_error:
        return JSONResponse({"detail": state.server_error}, status_code=500)
    if (request.method, path) != ("POST", "/api/v1/session"):
        refused = _refusal(state, request)
        if refused is not None:
            return JSONResponse({"detail": refused[1]}, status_code=refused[0])
    return await call_next(request)


def _whoami(token: dict[str, Any], via_session: bool) -> dict[str, Any]:
    name = "" if via_session else token["name"]
    return {"user": token["user"], "role": token["role"], "token_name": name, "via_session": via_session}


@router.post("/session", response_model=WhoAmI)
def log_in(body: LoginRequest, response: Response, state: State) -> Any:
    token = state.tokens.get(body.token)
    if token is None or token["revoked_at"]:
        raise HTTPException(401, "the token is unknown, revoked or expired (fake)")
    secret = secrets.token_urlsafe(16)
    state.sessions[secret] = token
    response.set_cookie(SESSION_COOKIE, secret, httponly=True, samesite="strict", path="/")
    return _whoami(token, via_session=True)


@router.delete("/session", status_code=204, response_class=Response)
def log_out(request: Request, state: State) -> Response:
    state.sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/whoami", response_model=WhoAmI)
def whoami(request: Request) -> Any:
    return _whoami(request.state.token, via_session=not request.headers.get("authorization"))


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(state: State) -> Any:
    return list(state.tokens.values())


@router.post("/tokens", status_code=201, response_model=TokenCreated)
def create_token(body: TokenCreate, request: Request, state: State) -> Any:
    secret = "mwms_" + secrets.token_urlsafe(16)
    by, expires = request.state.token["user"], expiry(body.expires_in_seconds)
    token = state.add_token(secret, body.user, body.role.value, body.name, created_by=by, expires_at=expires)
    return {**token, "token": secret}


def _revoke(tokens: dict[str, dict[str, Any]], token_id: str, missing: str) -> dict[str, Any]:
    for token in tokens.values():
        if token["id"] == token_id:
            token["revoked_at"] = token["revoked_at"] or _iso(now())
            return token
    raise HTTPException(404, missing)


@router.delete("/tokens/{token_id}", response_model=TokenOut)
def revoke_token(token_id: str, state: State) -> Any:
    return _revoke(state.tokens, token_id, f"no api token with id {token_id}; see mwms token list")


@router.get("/agent-tokens", response_model=list[TokenOut])
def list_join_tokens(state: State) -> Any:
    return list(state.join_tokens.values())


@router.post("/agent-tokens", status_code=201, response_model=TokenCreated)
def create_join_token(body: JoinTokenCreate, request: Request, state: State) -> Any:
    secret, by = "mwmsj_" + secrets.token_urlsafe(16), request.state.token["user"]
    token = state.add_token(
        secret, "", "", body.name, kind="join", created_by=by, expires_at=expiry(body.expires_in_seconds)
    )
    return {**token, "token": secret}


@router.delete("/agent-tokens/{token_id}", response_model=TokenOut)
def revoke_join_token(token_id: str, state: State) -> Any:
    return _revoke(state.join_tokens, token_id, f"no join token with id {token_id}")
