"""The one mapping from domain errors to HTTP responses, readable validation errors, and their schema.

Every 422 has one shape, `ValidationErrorOut` ({"detail": str, "errors": [...]}), whether pydantic or a
request limit refused the request, and the OpenAPI document says so for every operation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from server.errors import (
    Conflict,
    DomainError,
    Forbidden,
    InvalidInput,
    NotFound,
    Unauthenticated,
    UploadTooLarge,
)
from server.limits import LimitExceeded, TooManyRequests
from server.schemas import ValidationErrorOut
from server.states import InvalidTransition

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
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"
_OUR_422 = "#/components/schemas/ValidationErrorOut"


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


def install_error_handlers(app: FastAPI) -> None:
    async def domain_error(request: Request, error: Exception) -> JSONResponse:
        if isinstance(error, LimitExceeded):
            issue = {"loc": [_loc_part(p) for p in error.loc], "msg": str(error), "type": "limit_exceeded"}
            return JSONResponse(status_code=422, content=validation_body(str(error), [issue]))
        headers = _CLOSE if getattr(request.state, _CLOSE_AFTER_REFUSAL, False) else None
        return JSONResponse(status_code=http_status(error), content={"detail": str(error)}, headers=headers)

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
    _document_validation_errors(app)


def _document_validation_errors(app: FastAPI) -> None:
    """Makes /openapi.json describe the 422 body the handler above sends, not FastAPI's default one."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        model = ValidationErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model.pop("$defs", {}))
        components["ValidationErrorOut"] = model
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                response = operation.get("responses", {}).get("422")
                if response is None:
                    continue
                for content in response.get("content", {}).values():
                    if content.get("schema", {}).get("$ref") == _FASTAPI_422:
                        content["schema"] = {"$ref": _OUR_422}
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
