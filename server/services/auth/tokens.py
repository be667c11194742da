"""Bearer secrets: API tokens with roles, dashboard sessions derived from them, and agent join tokens.

A secret is shown once, when it is made, and stored only as its sha256. Looking a secret up by its hash
needs no constant-time compare: the hash of a guess reveals nothing about a stored one.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Token, utcnow
from mwms.server.errors import Conflict, Forbidden, InvalidInput, NotFound, TokenExpired, Unauthenticated
from mwms.server.schema_types import NAME_PATTERN, NAME_RULE
from mwms.server.schemas import MAX_TOKEN_NAME_CHARS

API_PREFIX = "mwms_"
SESSION_PREFIX = "mwmss_"
JOIN_PREFIX = "mwmsj_"
SECRET_BYTES = 32
SESSION_LIFETIME = timedelta(hours=12)
MAX_NAME = MAX_TOKEN_NAME_CHARS
_NAME = re.compile(NAME_PATTERN)


class Role(enum.IntEnum):
    """What a token may do; a higher role may do everything a lower one may."""

    VIEWER = 1
    USER = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Role:
        try:
            return cls[text.upper()]
        except KeyError:
            raise InvalidInput(f"unknown role {text!r}: use admin, user or viewer") from None


class TokenKind(str, enum.Enum):
    API = "api"
    SESSION = "session"
    JOIN = "join"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the user a token belongs to, its role, and the token that proved it."""

    user: str
    role: Role
    token_id: str  # the API token's id, also when a dashboard session derived from it made the call
    token_name: str
    via_session: bool = False
    session_id: str = ""  # the dashboard session's own token id, when via_session

    def may(self, role: Role) -> bool:
        return self.role >= role


def new_secret(prefix: str) -> str:
    """A random secret of SECRET_BYTES bytes, URL-safe, with a prefix that tells what it is."""
    return prefix + secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def same_secret_hash(a: str, b: str) -> bool:
    """Constant-time comparison of two hex hashes."""
    return hmac.compare_digest(a.encode(), b.encode())


def _check_name(value: str, what: str) -> str:
    """The name stripped, or InvalidInput: the API schema's rule (server/schema_types.py NAME_PATTERN)."""
    stripped = value.strip()
    if not _NAME.fullmatch(value) or len(stripped) > MAX_NAME:
        raise InvalidInput(f"{what} must be {NAME_RULE}, got {value[:MAX_NAME]!r}")
    return stripped


def expiry_text(moment: datetime | None) -> str:
    """'2026-12-02 21:05:38 UTC': how an expiry is written in messages (a 401 also gives it as
    `expired_at`, which clients read)."""
    if moment is None:
        return "an unknown time"
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _usable(token: Token, now: datetime) -> bool:
    return token.revoked_at is None and (token.expires_at is None or token.expires_at > now)


def create_api_token(
    session: Session,
    user: str,
    role: Role,
    name: str = "",
    expires_at: datetime | None = None,
    created_by: str = "",
    secret: str | None = None,
) -> tuple[Token, str]:
    """Stores a new API token and returns it with its secret, which is not kept anywhere."""
    user = _check_name(user, "user")
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidInput("the expiry lies in the past: give a future time or a positive duration")
    secret = secret or new_secret(API_PREFIX)
    digest = hash_secret(secret)
    if session.scalars(select(Token).where(Token.token_hash == digest)).first() is not None:
        raise Conflict("this token already exists")
    token = Token(
        kind=TokenKind.API.value,
        name=_check_name(name or user, "token name"),
        user=user,
        role=role.label,
        token_hash=digest,
        created_by=created_by,
        expires_at=expires_at,
    )
    session.add(token)
    session.flush()
    return token, secret


def ensure_admin_token(session: Session, secret: str) -> Token:
    """Makes `secret` (MWMS_ADMIN_TOKEN) a usable admin token: created, or revived if it was revoked."""
    if len(secret) < 16:
        raise InvalidInput("MWMS_ADMIN_TOKEN is too short: use at least 16 random characters")
    token = session.scalars(select(Token).where(Token.token_hash == hash_secret(secret))).first()
    if token is None:
        token, _ = create_api_token(session, "admin", Role.ADMIN, "MWMS_ADMIN_TOKEN", secret=secret)
        return token
    if token.kind != TokenKind.API.value:
        raise InvalidInput("MWMS_ADMIN_TOKEN equals a session or join token: choose another secret")
    token.role, token.revoked_at, token.expires_at = Role.ADMIN.label, None, None
    session.flush()
    return token


def _any_usable(session: Session, now: datetime | None, *conditions: Any) -> bool:
    rows = session.scalars(select(Token).where(*conditions)).all()
    return any(_usable(t, now or utcnow()) for t in rows)


def has_usable_admin(session: Session, now: datetime | None = None) -> bool:
    return _any_usable(session, now, Token.kind == TokenKind.API.value, Token.role == Role.ADMIN.label)


def has_usable_join_token(session: Session, now: datetime | None = None) -> bool:
    """True when an admin-made join token could admit an agent now."""
    return _any_usable(session, now, Token.kind == TokenKind.JOIN.value)


def authenticate(session: Session, secret: str, now: datetime | None = None) -> Principal:
    """The principal an API token or dashboard session secret stands for; Unauthenticated otherwise."""
    now = now or utcnow()
    token = session.scalars(select(Token).where(Token.token_hash == hash_secret(secret))).first()
    refusal = Unauthenticated(
        "the token is unknown, revoked or expired: ask an admin for a new one (mwms token create) "
        "and pass it with --token, MWMS_TOKEN or mwms login"
    )
    if token is not None and token.kind == TokenKind.SESSION.value and not _usable(token, now):
        raise Unauthenticated("the dashboard session has ended (logged out or expired): log in again")
    if (
        token is not None
        and token.kind == TokenKind.API.value
        and token.revoked_at is None
        and not _usable(token, now)
    ):
        # The holder of the secret may learn when it expired: it tells them to get a new one, not to
        # look for a typo. Unknown and revoked tokens stay indistinguishable.
        assert token.expires_at is not None  # usable but for its expiry
        raise TokenExpired(
            f"the token expired at {expiry_text(token.expires_at)}: ask an admin for a new one "
            "(mwms token create) and use it in place of this one",
            token.expires_at,
        )
    if token is None or token.kind == TokenKind.JOIN.value or not _usable(token, now):
        raise refusal
    owner = token
    if token.kind == TokenKind.SESSION.value:
        parent = session.get(Token, token.parent_id) if token.parent_id else None
        if parent is None or not _usable(parent, now):
            raise Unauthenticated("the session has ended (its token was revoked or expired): log in again")
        owner = parent
    return Principal(
        user=owner.user,
        role=Role.parse(owner.role),
        token_id=owner.id,
        token_name=owner.name,
        via_session=token.kind == TokenKind.SESSION.value,
        session_id=token.id if token.kind == TokenKind.SESSION.value else "",
    )


def check_may_mint(principal: Principal, what: str) -> None:
    """Forbidden when a dashboard session asks for `what` (a session, API or join tokens).

    A session is short-lived and ends at logout; a credential it made would outlive both, so a stolen
    session cookie would become a lasting one. Only an API token mints credentials.
    """
    if principal.via_session:
        raise Forbidden(
            f"a dashboard session may not create {what}: it would outlive the session's logout; use an API "
            "token instead (log in with the token itself, or pass it with --token, MWMS_TOKEN or `mwms login`)"
        )


def start_session(session: Session, principal: Principal, now: datetime | None = None) -> tuple[Token, str]:
    """A dashboard session for the API token that logged in; it ends with that token, at logout, or after
    12 h. A session's own secret opens no second session (Forbidden): that one would outlive the logout."""
    check_may_mint(principal, "another session")
    now = now or utcnow()
    parent = session.get(Token, principal.token_id)
    assert parent is not None
    expires = now + SESSION_LIFETIME
    if parent.expires_at is not None:
        expires = min(expires, parent.expires_at)
    secret = new_secret(SESSION_PREFIX)
    token = Token(
        kind=TokenKind.SESSION.value,
        name=f"dashboard session of {parent.name}",
        user=parent.user,
        role=parent.role,
        token_hash=hash_secret(secret),
        parent_id=parent.id,
        created_by=parent.user,
        expires_at=expires,
    )
    session.add(token)
    session.flush()
    return token, secret


def end_session(session: Session, secret: str, now: datetime | None = None) -> None:
    """Revokes the dashboard session whose secret this is; unknown secrets are ignored."""
    token = session.scalars(select(Token).where(Token.token_hash == hash_secret(secret))).first()
    _revoke_session(session, token, now)


def log_out(session: Session, caller: Principal, cookie_secret: str, now: datetime | None = None) -> None:
    """Ends, at once, the dashboard session the caller authenticated with (cookie or bearer) and the one in
    its cookie, if another; a call made with an API token ends only the cookie's session."""
    if caller.session_id:
        _revoke_session(session, session.get(Token, caller.session_id), now)
    if cookie_secret:
        end_session(session, cookie_secret, now)


def _revoke_session(session: Session, token: Token | None, now: datetime | None) -> None:
    if token is not None and token.kind == TokenKind.SESSION.value and token.revoked_at is None:
        token.revoked_at = now or utcnow()
        session.flush()


def list_tokens(session: Session, kind: TokenKind) -> list[Token]:
    return list(
        session.scalars(select(Token).where(Token.kind == kind.value).order_by(Token.created_at)).all()
    )


def revoke_token(session: Session, token_id: str, kind: TokenKind, now: datetime | None = None) -> Token:
    """Revokes an API or join token; the sessions it opened end with it."""
    token = session.get(Token, token_id)
    if token is None or token.kind != kind.value:
        listing = "mwms token list" if kind is TokenKind.API else "mwms agent-token list"
        raise NotFound(f"no {kind.value} token with id {token_id}; see {listing}")
    if token.revoked_at is None:
        token.revoked_at = now or utcnow()
        session.flush()
    return token


def revoke_api_token(session: Session, token_id: str, now: datetime | None = None) -> Token:
    """Revokes an API token, unless it is the last usable admin token: then nobody could administer the
    coordinator any more (Conflict, saying what to do instead)."""
    now = now or utcnow()
    # Locked (PostgreSQL), so that two admins revoking each other's tokens at once cannot both succeed.
    admins = session.scalars(
        select(Token)
        .where(Token.kind == TokenKind.API.value, Token.role == Role.ADMIN.label)
        .with_for_update()
    ).all()
    token = next((t for t in admins if t.id == token_id), None)
    others = [t for t in admins if t.id != token_id and _usable(t, now)]
    if token is not None and _usable(token, now) and not others:
        raise Conflict(
            f"token {token.id} ({token.name!r} of {token.user!r}) is the last usable admin token: revoking it "
            "would leave nobody able to administer the coordinator. Create another admin token first "
            "(mwms token create --user NAME --role admin), then revoke this one"
        )
    return revoke_token(session, token_id, TokenKind.API, now)


def create_join_token(
    session: Session, name: str, expires_at: datetime | None = None, created_by: str = ""
) -> tuple[Token, str]:
    """A token that admits new agents (`mwms agent` with MWMS_JOIN_TOKEN or --join-token-file)."""
    if expires_at is not None and expires_at <= utcnow():
        raise InvalidInput("the expiry lies in the past: give a future time or a positive duration")
    secret = new_secret(JOIN_PREFIX)
    token = Token(
        kind=TokenKind.JOIN.value,
        name=_check_name(name or "agents", "token name"),
        token_hash=hash_secret(secret),
        created_by=created_by,
        expires_at=expires_at,
    )
    session.add(token)
    session.flush()
    return token, secret


def join_token_valid(session: Session, secret: str, bootstrap: str = "", now: datetime | None = None) -> bool:
    """True for a usable join token made by an admin, or for the coordinator's MWMS_JOIN_TOKEN."""
    if not secret:
        return False
    if bootstrap and hmac.compare_digest(secret.encode(), bootstrap.encode()):
        return True
    token = session.scalars(select(Token).where(Token.token_hash == hash_secret(secret))).first()
    return token is not None and token.kind == TokenKind.JOIN.value and _usable(token, now or utcnow())
