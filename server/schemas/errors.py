"""The bodies of error responses."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorOut(BaseModel):
    """Every error response but 422: what was wrong and what to do about it."""

    detail: str


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="where: 'body', 'query' or 'path', then the field's path")
    msg: str
    type: str


class ValidationErrorOut(BaseModel):
    """A 422: every problem in one sentence (`detail`), and each one on its own (`errors`)."""

    detail: str
    errors: list[ValidationIssue]
