"""/api/v1/tokens and /api/v1/agent-tokens: API tokens for people and join tokens for agents (admin only)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter

from mwms.server.api.auth import AdminOnly, AdminTokenOnly
from mwms.server.api.deps import ReadSession, WiringDep
from mwms.server.api.views import token_out
from mwms.server.db.models import Token, utcnow
from mwms.server.schemas import ErrorOut, JoinTokenCreate, TokenCreate, TokenCreated, TokenOut
from mwms.server.services.auth import tokens
from mwms.server.services.auth.tokens import Role, TokenKind

router = APIRouter(prefix="/api/v1", tags=["tokens"])
ERRORS: dict[int | str, dict[str, Any]] = {403: {"model": ErrorOut}, 404: {"model": ErrorOut}}
LAST_ADMIN: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "the token is the last usable admin token"}
}


def _created(token: Token, secret: str) -> TokenCreated:
    return TokenCreated(**token_out(token).model_dump(), token=secret)


def _expiry(seconds: int | None) -> datetime | None:
    return utcnow() + timedelta(seconds=seconds) if seconds else None


@router.get("/tokens", response_model=list[TokenOut], responses=ERRORS)
def list_api_tokens(_admin: AdminOnly, session: ReadSession) -> list[TokenOut]:
    """Every API token (never its secret)."""
    return [token_out(t) for t in tokens.list_tokens(session, TokenKind.API)]


@router.post("/tokens", status_code=201, response_model=TokenCreated, responses=ERRORS)
def create_api_token(body: TokenCreate, admin: AdminTokenOnly, wiring: WiringDep) -> TokenCreated:
    """A new API token; its secret is in this response only. Made with an admin API token, never with a
    dashboard login (403), whose logout would not end what it made."""
    with wiring.db.write() as session:
        token, secret = tokens.create_api_token(
            session,
            body.user,
            Role.parse(body.role.value),
            body.name,
            _expiry(body.expires_in_seconds),
            created_by=admin.user,
        )
        return _created(token, secret)


@router.delete("/tokens/{token_id}", response_model=TokenOut, responses=ERRORS | LAST_ADMIN)
def revoke_api_token(token_id: str, _admin: AdminOnly, wiring: WiringDep) -> TokenOut:
    """Revokes an API token at once; dashboard logins it opened end with it. The last usable admin token
    is not revoked (409): create another admin token first."""
    with wiring.db.write() as session:
        return token_out(tokens.revoke_api_token(session, token_id))


@router.get("/agent-tokens", response_model=list[TokenOut], responses=ERRORS)
def list_join_tokens(_admin: AdminOnly, session: ReadSession) -> list[TokenOut]:
    """Every join token (never its secret)."""
    return [token_out(t) for t in tokens.list_tokens(session, TokenKind.JOIN)]


@router.post("/agent-tokens", status_code=201, response_model=TokenCreated, responses=ERRORS)
def create_join_token(body: JoinTokenCreate, admin: AdminTokenOnly, wiring: WiringDep) -> TokenCreated:
    """A new join token for `mwms agent` (MWMS_JOIN_TOKEN or --join-token-file); its secret is in this response only. Made with an
    admin API token, never with a dashboard login (403)."""
    with wiring.db.write() as session:
        token, secret = tokens.create_join_token(
            session, body.name, _expiry(body.expires_in_seconds), created_by=admin.user
        )
        return _created(token, secret)


@router.delete("/agent-tokens/{token_id}", response_model=TokenOut, responses=ERRORS)
def revoke_join_token(token_id: str, _admin: AdminOnly, wiring: WiringDep) -> TokenOut:
    """Revokes a join token: it admits no new agent; agents that joined with it keep their credentials."""
    with wiring.db.write() as session:
        return token_out(tokens.revoke_token(session, token_id, TokenKind.JOIN))
