"""/api/v1/session and /api/v1/whoami: the dashboard's login (log-in and log-out), and who the caller is.

The paths, the cookie and the token kind keep the word "session" (the HTTP contract); in the code a
dashboard login is a login, and a session is a database session.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from mwms.server.api.auth import LOGIN_COOKIE, Caller, same_origin
from mwms.server.api.deps import WiringDep
from mwms.server.errors import Forbidden, Unauthenticated
from mwms.server.schemas import ErrorOut, LoginRequest, RoleName, WhoAmI
from mwms.server.services.auth import tokens
from mwms.server.services.auth.tokens import Principal

router = APIRouter(prefix="/api/v1", tags=["session"])


# What a person at the login form can do, in place of the CLI's advice (--token, MWMS_TOKEN, mwms login).
LOGIN_PAGE_ADVICE = (
    "Paste a current token here; an admin makes one with: mwms token create (the coordinator's first "
    "admin token is in its <data dir>/admin-token)."
)


def for_the_login_page(refusal: str) -> str:
    """A refusal of the token (services.auth.tokens: "what was wrong: what to do") reworded for the login page:
    what was wrong, kept (an expired token says when), then what to do in the browser."""
    what = refusal.partition(": ")[0].strip() or "the token was refused"
    return f"{what}. {LOGIN_PAGE_ADVICE}"


def whoami_out(principal: Principal) -> WhoAmI:
    return WhoAmI(
        user=principal.user,
        role=RoleName(principal.role.label),
        token_name=principal.token_name,
        via_session=principal.via_session,
    )


@router.get("/whoami", response_model=WhoAmI)
def whoami(caller: Caller) -> WhoAmI:
    """The user and role of the token (or dashboard login) that made this request."""
    return whoami_out(caller)


@router.post(
    "/session", response_model=WhoAmI, responses={401: {"model": ErrorOut}, 403: {"model": ErrorOut}}
)
async def log_in(body: LoginRequest, request: Request, response: Response, wiring: WiringDep) -> WhoAmI:
    """Exchanges an API token for an HttpOnly, SameSite=Strict login cookie (the dashboard's log-in).
    A login's secret is refused (403): a login opens no other login, which would outlive its logout. A
    refused token (401) is explained for the login page, not with the CLI's options."""
    if request.headers.get("origin") and not same_origin(request.scope):
        raise Forbidden("cross-site log-in refused: log in from the dashboard's own page")

    def log_in_once() -> tuple[Principal, str, int]:
        with wiring.db.write() as session:
            try:
                principal = tokens.authenticate(session, body.token)
            except Unauthenticated as error:
                raise Unauthenticated(for_the_login_page(str(error))) from None
            token, secret = tokens.start_session(session, principal)
            assert token.expires_at is not None
            lifetime = int((token.expires_at - token.created_at).total_seconds())
            return principal, secret, lifetime

    principal, secret, lifetime = await asyncio.to_thread(log_in_once)
    response.set_cookie(
        LOGIN_COOKIE,
        secret,
        max_age=max(1, lifetime),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return whoami_out(principal)


@router.delete("/session", status_code=204)
async def log_out(request: Request, wiring: WiringDep, caller: Caller) -> Response:
    """Ends the dashboard login that made this request (cookie or bearer) and the cookie's: its secret
    is refused (401) from now on, and the cookie is cleared."""
    secret = request.cookies.get(LOGIN_COOKIE, "")

    def log_out_once() -> None:
        with wiring.db.write() as session:
            tokens.log_out(session, caller, secret)

    await asyncio.to_thread(log_out_once)
    response = Response(status_code=204)
    response.delete_cookie(LOGIN_COOKIE, path="/", httponly=True, samesite="strict")
    return response
