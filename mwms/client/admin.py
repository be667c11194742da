"""Who a token is, and the admin's tools: API tokens, join tokens for agents, removing an agent.

`AdminMethods` holds the methods `Client` offers for them (mixed into `Client`, which stays the one way in);
changing anything here is an admin's (others get `Forbidden`). `Identity` and `Token` keep the API's
object in `raw`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mwms.client.models import Agent, parse_time
from mwms.client.rest import RestApi


@dataclass(frozen=True)
class Identity:
    """Who the coordinator takes a token for: its user, role ("admin", "user", "viewer") and the token's
    name; `via_session` when a dashboard session stood for the token."""

    user: str
    role: str
    token_name: str
    via_session: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Identity:
        """The Identity an API object describes (kept as `raw`)."""
        return cls(
            user=str(raw["user"]),
            role=str(raw["role"]),
            token_name=str(raw.get("token_name") or ""),
            via_session=bool(raw.get("via_session")),
            raw=raw,
        )


@dataclass(frozen=True)
class Token:
    """An API token (`kind` "api": a user's, with a role) or a join token for agents (`kind` "join"), as
    listed: never its secret, except `secret` right after it was created (the only time it is shown)."""

    id: str
    kind: str
    name: str
    user: str
    role: str
    created_by: str
    created_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_api(cls, raw: dict[str, Any]) -> Token:
        """The Token an API object describes (kept as `raw`)."""
        secret = raw.get("token")
        return cls(
            id=str(raw["id"]),
            kind=str(raw.get("kind") or ""),
            name=str(raw.get("name") or ""),
            user=str(raw.get("user") or ""),
            role=str(raw.get("role") or ""),
            created_by=str(raw.get("created_by") or ""),
            created_at=parse_time(raw.get("created_at")),
            expires_at=parse_time(raw.get("expires_at")),
            revoked_at=parse_time(raw.get("revoked_at")),
            raw=raw,
            secret=None if secret is None else str(secret),
        )

    @property
    def revoked(self) -> bool:
        """True once it was revoked."""
        return self.revoked_at is not None


class AdminMethods:
    """`Client`'s methods for identity, tokens and removing agents (see `Client`)."""

    rest: RestApi

    def identity(self) -> Identity:
        """The user, role and token name of the token this client sends."""
        return Identity.from_api(self.rest.whoami())

    def whoami(self) -> dict[str, Any]:
        """{"user", "role", "token_name", "via_session"} of the token this client sends, as the API sent it
        (`identity()` for it typed)."""
        return self.identity().raw

    def tokens(self) -> list[Token]:
        """API tokens (never their secrets), revoked and expired ones included (admin)."""
        return [Token.from_api(raw) for raw in self.rest.list_tokens()]

    def create_token(
        self, user: str, role: str = "user", name: str = "", *, expires_in_seconds: int | None = None
    ) -> Token:
        """A new API token for `user` with `role` (admin); its `secret` is in this answer only."""
        return Token.from_api(self.rest.create_token(user, role, name, expires_in_seconds))

    def revoke_token(self, token_id: str) -> Token:
        """Revokes an API token at once (admin); dashboard sessions opened with it end too."""
        return Token.from_api(self.rest.revoke_token(token_id))

    def join_tokens(self) -> list[Token]:
        """Join tokens for agents (never their secrets), revoked and expired ones included (admin)."""
        return [Token.from_api(raw) for raw in self.rest.list_join_tokens()]

    def create_join_token(self, name: str = "agents", *, expires_in_seconds: int | None = None) -> Token:
        """A new join token for agents (admin); its `secret` is in this answer only."""
        return Token.from_api(self.rest.create_join_token(name, expires_in_seconds))

    def revoke_join_token(self, token_id: str) -> Token:
        """Revokes a join token (admin): no new agent joins with it; joined agents stay."""
        return Token.from_api(self.rest.revoke_join_token(token_id))

    def remove_agent(self, agent: str) -> Agent:
        """Removes an agent, its id or name (admin): its credential is revoked and the tasks it ran end as
        a lost agent's do. Returns the agent."""
        return Agent.from_api(self.rest.remove_agent(agent))
