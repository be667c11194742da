"""The bodies of error responses."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ErrorOut(BaseModel):
    """Every error response but 422: what was wrong and what to do about it."""

    detail: str
    expired_at: datetime | None = Field(
        default=None,
        description="with a 401 for an API token past its expiry: when it expired (the holder may learn "
        "it; unknown and revoked tokens stay indistinguishable)",
    )


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="where: 'body', 'query' or 'path', then the field's path")
    msg: str
    type: str


class ValidationErrorOut(BaseModel):
    """A 422: every problem in one sentence (`detail`), and each one on its own (`errors`)."""

    detail: str
    errors: list[ValidationIssue]
