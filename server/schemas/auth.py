"""API tokens, join tokens, login sessions and who the caller is."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from mwms.server.schema_types import (
    NAME_RULE,
    OPTIONAL_NAME_PATTERN,
    WHOLE_FLOATS_AS_INT,
    PrintableName,
    matching,
)


class RoleName(str, Enum):
    ADMIN = "admin"
    USER = "user"
    VIEWER = "viewer"


MAX_TOKEN_LIFETIME_S = 10 * 365 * 86400
MAX_TOKEN_NAME_CHARS = 200
Lifetime = Annotated[int, Field(gt=0, le=MAX_TOKEN_LIFETIME_S), Strict(), WHOLE_FLOATS_AS_INT]


class TokenCreate(BaseModel):
    """A new API token for a user."""

    model_config = ConfigDict(extra="forbid")

    user: PrintableName = Field(
        min_length=1,
        max_length=MAX_TOKEN_NAME_CHARS,
        description=f"who the token belongs to; owns their jobs: {NAME_RULE}",
    )
    role: RoleName = RoleName.USER
    name: Annotated[
        str,
        Field(json_schema_extra={"pattern": OPTIONAL_NAME_PATTERN}),
        matching(OPTIONAL_NAME_PATTERN, "empty or " + NAME_RULE),
    ] = Field(
        default="",
        max_length=MAX_TOKEN_NAME_CHARS,
        description="a label, e.g. the machine it is used on; default: the user",
    )
    expires_in_seconds: Lifetime | None = None


class JoinTokenCreate(BaseModel):
    """A new join token that admits agents."""

    model_config = ConfigDict(extra="forbid")

    name: PrintableName = Field(
        default="agents", min_length=1, max_length=MAX_TOKEN_NAME_CHARS, description=NAME_RULE
    )
    expires_in_seconds: Lifetime | None = None


class TokenOut(BaseModel):
    """A token as listed: never its secret."""

    id: str
    kind: str
    name: str
    user: str
    role: str
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="the secret; shown only in this response")


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=500)


class WhoAmI(BaseModel):
    user: str
    role: RoleName
    token_name: str
    via_session: bool
