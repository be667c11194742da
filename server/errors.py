"""Domain errors raised by services; mapped to HTTP in server/api and to gRPC in server/rpc, once each."""

from __future__ import annotations

from datetime import datetime


class DomainError(Exception):
    """Base class: the message says what was wrong and what to do about it."""


class NotFound(DomainError):
    """An id that names nothing."""


class InvalidInput(DomainError):
    """A request that cannot be carried out as given."""


class UploadTooLarge(InvalidInput):
    """An upload over the size limit (HTTP 413 for bundle uploads)."""


class Conflict(DomainError):
    """A request that contradicts the current state (e.g. cancelling a finished job)."""


class Unauthenticated(DomainError):
    """A caller with no credential, or one that is unknown, revoked or expired."""


class TokenExpired(Unauthenticated):
    """An API token presented after its expiry: its holder may learn when (the 401's `expired_at`)."""

    def __init__(self, message: str, expired_at: datetime) -> None:
        super().__init__(message)
        self.expired_at = expired_at


class Forbidden(DomainError):
    """An authenticated caller whose role or ownership does not allow the request."""


class NameTaken(Conflict):
    """A name already held by something live."""
