"""Tokens on a real SQLite database: hashed at rest, roles, revocation, expiry, sessions, join tokens."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from mwms.server.db.models import Token, utcnow
from mwms.server.errors import InvalidInput, NotFound, Unauthenticated
from mwms.server.services.auth import tokens
from mwms.server.services.auth.tokens import Role, TokenKind


def test_secrets_are_random_and_stored_only_as_hashes(db):
    with db.write() as session:
        _, first = tokens.create_api_token(session, "alice", Role.USER)
        _, second = tokens.create_api_token(session, "alice", Role.USER, "ci")
    assert first != second and first.startswith("mwms_") and len(first) - len("mwms_") >= 43
    with db.read() as session:
        stored = session.scalars(select(Token)).all()
        assert {t.token_hash for t in stored} == {tokens.hash_secret(first), tokens.hash_secret(second)}
        dump = " ".join(str(vars(t)) for t in stored)
        assert first not in dump and second not in dump
        principal = tokens.authenticate(session, second)
    assert (principal.user, principal.role, principal.token_name) == ("alice", Role.USER, "ci")


def test_revoked_expired_and_unknown_tokens_are_refused(db):
    now = utcnow()
    with db.write() as session:
        revoked, revoked_secret = tokens.create_api_token(session, "bob", Role.ADMIN)
        _, expiring = tokens.create_api_token(
            session, "bob", Role.VIEWER, expires_at=now + timedelta(hours=1)
        )
        tokens.revoke_token(session, revoked.id, TokenKind.API)
    with db.read() as session:
        for secret, at in [(revoked_secret, now), (expiring, now + timedelta(hours=2)), ("mwms_nope", now)]:
            with pytest.raises(Unauthenticated, match="mwms token create"):
                tokens.authenticate(session, secret, now=at)
        assert tokens.authenticate(session, expiring, now=now).role is Role.VIEWER


def test_roles_are_ordered():
    assert Role.ADMIN > Role.USER > Role.VIEWER
    assert Role.parse("Viewer") is Role.VIEWER
    with pytest.raises(InvalidInput, match="admin, user or viewer"):
        Role.parse("root")


def test_sessions_end_with_their_token_and_on_logout(db):
    with db.write() as session:
        parent, secret = tokens.create_api_token(session, "carol", Role.USER)
        principal = tokens.authenticate(session, secret)
        _, first = tokens.start_session(session, principal)
        _, second = tokens.start_session(session, principal)
    with db.write() as session:
        assert tokens.authenticate(session, first).via_session
        tokens.end_session(session, first)
        with pytest.raises(Unauthenticated):
            tokens.authenticate(session, first)
        tokens.revoke_token(session, parent.id, TokenKind.API)
        with pytest.raises(Unauthenticated, match="log in again"):
            tokens.authenticate(session, second)


def test_a_session_never_outlives_its_token(db):
    with db.write() as session:
        _, secret = tokens.create_api_token(
            session, "dan", Role.USER, expires_at=utcnow() + timedelta(minutes=5)
        )
        token, _ = tokens.start_session(session, tokens.authenticate(session, secret))
    assert token.expires_at is not None and token.expires_at <= utcnow() + timedelta(minutes=5)


def test_join_tokens_admit_agents_but_not_api_calls(db):
    with db.write() as session:
        join, secret = tokens.create_join_token(session, "rack-1")
        _, api_secret = tokens.create_api_token(session, "eve", Role.ADMIN)
    with db.write() as session:
        assert tokens.join_token_valid(session, secret)
        assert tokens.join_token_valid(session, "bootstrap-secret", bootstrap="bootstrap-secret")
        assert not tokens.join_token_valid(session, api_secret)
        assert not tokens.join_token_valid(session, "")
        with pytest.raises(Unauthenticated):
            tokens.authenticate(session, secret)
        with pytest.raises(NotFound, match="no api token .* mwms token list"):
            tokens.revoke_token(session, join.id, TokenKind.API)
        tokens.revoke_token(session, join.id, TokenKind.JOIN)
        assert not tokens.join_token_valid(session, secret)


def test_admin_token_from_the_environment_is_created_once_and_revived(db):
    secret = "a-long-enough-scripted-secret"
    with db.write() as session:
        first = tokens.ensure_admin_token(session, secret)
        tokens.revoke_token(session, first.id, TokenKind.API)
    with db.write() as session:
        again = tokens.ensure_admin_token(session, secret)
        assert again.id == first.id and tokens.authenticate(session, secret).role is Role.ADMIN
        with pytest.raises(InvalidInput, match="too short"):
            tokens.ensure_admin_token(session, "short")


def test_bad_names_and_past_expiry_are_refused(db):
    with db.write() as session:
        for user in ["", " ", "x" * 201, "bad\nname"]:
            with pytest.raises(InvalidInput):
                tokens.create_api_token(session, user, Role.USER)
        with pytest.raises(InvalidInput, match="past"):
            tokens.create_api_token(session, "fay", Role.USER, expires_at=utcnow() - timedelta(seconds=1))
