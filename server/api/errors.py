"""The one mapping from domain errors to HTTP responses, and readable validation errors."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from server.errors import Conflict, DomainError, Forbidden, InvalidInput, NotFound, Unauthenticated
from server.states import InvalidTransition

log = logging.getLogger("mwms.server.api")
INTERNAL_ERROR = "internal error: the coordinator logged the cause; try again, and report it if it persists"

_STATUS: list[tuple[type[Exception], int]] = [
    (NotFound, 404),
    (InvalidInput, 400),
    (Conflict, 409),
    (InvalidTransition, 409),
    (Unauthenticated, 401),
    (Forbidden, 403),
]


def http_status(error: Exception) -> int:
    for kind, status in _STATUS:
        if isinstance(error, kind):
            return status
    return 400


def _describe(error: dict) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body",))
    message = error.get("msg", "invalid value")
    if error.get("type") == "json_invalid":
        return "the request body is not valid JSON: " + message
    return f"{location}: {message}" if location else message


def install_error_handlers(app: FastAPI) -> None:
    async def domain_error(_request: Request, error: Exception) -> JSONResponse:
        return JSONResponse(status_code=http_status(error), content={"detail": str(error)})

    async def validation_error(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        errors = list(error.errors())
        detail = "invalid request: " + "; ".join(_describe(e) for e in errors)
        clean = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in errors
        ]
        return JSONResponse(status_code=422, content={"detail": detail, "errors": clean})

    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        # Never show SQL, tracebacks or exception class names to a caller: they help only an attacker.
        log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return JSONResponse(status_code=500, content={"detail": INTERNAL_ERROR})

    app.add_exception_handler(Exception, unexpected_error)
    app.add_exception_handler(DomainError, domain_error)
    app.add_exception_handler(InvalidTransition, domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
