"""The one mapping from domain errors to HTTP responses, readable validation errors, and their schema.

Every 422 has one shape, `ValidationErrorOut` ({"detail": str, "errors": [...]}), whether pydantic or a
request limit refused the request, or the body was no JSON at all; server/api/openapi_document.py documents
it for every operation. A 405 names, in `Allow`, every method its path takes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timezone
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from mwms.server.errors import (
    Conflict,
    DomainError,
    Forbidden,
    InvalidInput,
    NotFound,
    TokenExpired,
    Unauthenticated,
    UploadTooLarge,
)
from mwms.server.limits import LimitExceeded, TooManyRequests
from mwms.server.schemas import ValidationErrorOut
from mwms.server.states import InvalidTransition

log = logging.getLogger("mwms.server.api")
INTERNAL_ERROR = "internal error: the coordinator logged the cause; try again, and report it if it persists"

_STATUS: list[tuple[type[Exception], int]] = [
    (NotFound, 404),
    (UploadTooLarge, 413),
    (InvalidInput, 400),
    (Conflict, 409),
    (InvalidTransition, 409),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (LimitExceeded, 422),
    (TooManyRequests, 429),
]
# A request refused with its body left unread ends its connection with the answer: the unread rest is
# not drained (an upload over the limit is not read to its end to be thrown away).
_CLOSE = {"Connection": "close"}
_CLOSE_AFTER_REFUSAL = "close_after_refusal"
# FastAPI answers a body it cannot decode (not UTF-8) with a 400 of this detail; invalid JSON is a 422.
_BODY_NOT_DECODED = "There was an error parsing the body"
_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def http_status(error: Exception) -> int:
    for kind, status in _STATUS:
        if isinstance(error, kind):
            return status
    return 400


@contextmanager
def closing_on_refusal(request: Request) -> Iterator[None]:
    """Within it, an InvalidInput (UploadTooLarge included) refuses the request with Connection: close,
    for a route that stops reading the body when it refuses it."""
    try:
        yield
    except InvalidInput:
        setattr(request.state, _CLOSE_AFTER_REFUSAL, True)
        raise


def _describe(error: dict) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body",))
    message = error.get("msg", "invalid value")
    if error.get("type") == "json_invalid":
        return "the request body is not valid JSON: " + message
    return f"{location}: {message}" if location else message


def validation_body(detail: str, errors: list[dict[str, Any]]) -> dict[str, Any]:
    """A 422 body in the documented shape."""
    return ValidationErrorOut.model_validate({"detail": detail, "errors": errors}).model_dump(mode="json")


def _loc_part(part: Any) -> str | int:
    return part if isinstance(part, int) and not isinstance(part, bool) else str(part)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app takes on this request's path (Starlette's 405 names only the
    first route's, and FastAPI makes one route per method)."""
    routes = request.app.router.routes
    allowed = []
    for method in _METHODS:  # asked of the routes themselves: FastAPI nests the included routers' routes
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] is Match.FULL for route in routes):
            allowed.append(method)
    return allowed


async def http_error(request: Request, error: Exception) -> Response:
    """Starlette's and FastAPI's own refusals: a 405 lists all the path's methods, an undecodable body is a 422."""
    assert isinstance(error, StarletteHTTPException)
    if error.status_code == 405:
        allowed = ", ".join(allowed_methods(request))
        detail = f"{request.method} is not a method of {request.url.path}: use {allowed}"
        return JSONResponse(status_code=405, content={"detail": detail}, headers={"Allow": allowed})
    if error.status_code == 400 and error.detail == _BODY_NOT_DECODED:
        detail = "the request body is not valid JSON: it is not UTF-8 text"
        issue = {"loc": ["body"], "msg": "not UTF-8 text", "type": "json_invalid"}
        return JSONResponse(status_code=422, content=validation_body(detail, [issue]))
    return await http_exception_handler(request, error)


def error_content(error: Exception) -> dict[str, Any]:
    """An error response's body (ErrorOut): its message, and for an expired API token when it expired."""
    content: dict[str, Any] = {"detail": str(error)}
    if isinstance(error, TokenExpired):
        moment = error.expired_at
        moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
        content["expired_at"] = moment.isoformat()
    return content


def install_error_handlers(app: FastAPI) -> None:
    async def domain_error(request: Request, error: Exception) -> JSONResponse:
        if isinstance(error, LimitExceeded):
            issue = {"loc": [_loc_part(p) for p in error.loc], "msg": str(error), "type": "limit_exceeded"}
            return JSONResponse(status_code=422, content=validation_body(str(error), [issue]))
        headers = _CLOSE if getattr(request.state, _CLOSE_AFTER_REFUSAL, False) else None
        return JSONResponse(status_code=http_status(error), content=error_content(error), headers=headers)

    async def validation_error(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        errors = list(error.errors())
        detail = "invalid request: " + "; ".join(_describe(e) for e in errors)
        clean = [
            {
                "loc": [_loc_part(p) for p in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in errors
        ]
        return JSONResponse(status_code=422, content=validation_body(detail, clean))

    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        # Never show SQL, tracebacks or exception class names to a caller: they help only an attacker.
        log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return JSONResponse(status_code=500, content={"detail": INTERNAL_ERROR})

    app.add_exception_handler(Exception, unexpected_error)
    app.add_exception_handler(DomainError, domain_error)
    app.add_exception_handler(InvalidTransition, domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
