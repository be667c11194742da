"""The one mapping from domain errors to gRPC status codes."""

from __future__ import annotations

import grpc

from mwms.server.errors import (
    DomainError,
    Forbidden,
    InvalidInput,
    NameTaken,
    NotFound,
    Unauthenticated,
    UploadTooLarge,
)

_STATUS: list[tuple[type[DomainError], grpc.StatusCode]] = [
    (NameTaken, grpc.StatusCode.ALREADY_EXISTS),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (UploadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (Forbidden, grpc.StatusCode.PERMISSION_DENIED),
]


def grpc_status(error: DomainError) -> grpc.StatusCode:
    """The status code for a domain error; FAILED_PRECONDITION for the rest (conflicts)."""
    for kind, code in _STATUS:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.FAILED_PRECONDITION
