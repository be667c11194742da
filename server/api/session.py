"""/api/v1/session and /api/v1/whoami: dashboard log-in and log-out, and who the caller is."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from server.api.auth import SESSION_COOKIE, Caller, same_origin
from server.api.deps import RuntimeDep
from server.errors import Forbidden
from server.schemas import ErrorOut, LoginRequest, RoleName, WhoAmI
from server.services import tokens
from server.services.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["session"])


def whoami_out(principal: Principal) -> WhoAmI:
    return WhoAmI(
        user=principal.user,
        role=RoleName(principal.role.label),
        token_name=principal.token_name,
        via_session=principal.via_session,
    )


@router.get("/whoami", response_model=WhoAmI)
def whoami(caller: Caller) -> WhoAmI:
    """The user and role of the token (or dashboard session) that made this request."""
    return whoami_out(caller)


@router.post(
    "/session", response_model=WhoAmI, responses={401: {"model": ErrorOut}, 403: {"model": ErrorOut}}
)
async def log_in(body: LoginRequest, request: Request, response: Response, rt: RuntimeDep) -> WhoAmI:
    """Exchanges an API token for an HttpOnly, SameSite=Strict session cookie (the dashboard's log-in).
    A session's secret is refused (403): a session opens no other session, which would outlive its logout."""
    if request.headers.get("origin") and not same_origin(request.scope):
        raise Forbidden("cross-site log-in refused: log in from the dashboard's own page")

    def start() -> tuple[Principal, str, int]:
        with rt.db.write() as session:
            principal = tokens.authenticate(session, body.token)
            token, secret = tokens.start_session(session, principal)
            assert token.expires_at is not None
            lifetime = int((token.expires_at - token.created_at).total_seconds())
            return principal, secret, lifetime

    principal, secret, lifetime = await asyncio.to_thread(start)
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=max(1, lifetime),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return whoami_out(principal)


@router.delete("/session", status_code=204)
async def log_out(request: Request, rt: RuntimeDep, caller: Caller) -> Response:
    """Ends the dashboard session that made this request (cookie or bearer) and the cookie's: its secret
    is refused (401) from now on, and the cookie is cleared."""
    secret = request.cookies.get(SESSION_COOKIE, "")

    def end() -> None:
        with rt.db.write() as session:
            tokens.log_out(session, caller, secret)

    await asyncio.to_thread(end)
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
