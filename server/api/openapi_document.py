"""What /openapi.json says beyond what FastAPI derives from the routes, so that generated clients and
Swagger's Authorize button work: short operation ids, the bearer scheme on every protected operation,
every answer the middleware and error handlers give (401, 403, 413, 422 in its real shape), and the
limits of this coordinator's settings that a schema can state (MWMS_MAX_TIMEOUT_SECONDS and others).

Which operations are protected comes from the same rule the middleware applies (server/api/auth.py
`is_public`), so the document cannot claim a route is open that the middleware guards, nor the reverse.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from mwms.server.api.auth import is_public
from mwms.server.limits import INT64_MAX, INT64_MIN
from mwms.server.schemas import SETTING_LIMIT, ErrorOut, ValidationErrorOut
from mwms.server.settings import Settings

BEARER_SCHEME = "bearer"  # the name of the scheme in components.securitySchemes
SECURITY_SCHEMES = {
    BEARER_SCHEME: {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token (`mwms token create`; the first admin token is in <data dir>/admin-token). "
        "The dashboard's login cookie is accepted too: after logging in to the dashboard, /docs needs no token.",
    }
}
_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
_VALIDATION = {
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ValidationErrorOut"}}}
}
UNAUTHENTICATED = {
    "description": "no token or login cookie, or one that is unknown, revoked or expired",
    **_ERROR,
}
FORBIDDEN = {
    "description": "the caller's role may not do this (or a login cookie's write came from another page)",
    **_ERROR,
}
BODY_TOO_LARGE = {"description": "the body is over MWMS_MAX_REQUEST_BODY_BYTES", **_ERROR}
INVALID = {"description": "the request is not valid: every problem named", **_VALIDATION}
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"
_FLOAT_EXACT = 2**53  # integers up to this are exact as floats
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def operation_id(route: APIRoute) -> str:
    """A route's operation id: its function's name (`list_jobs`), which generated clients name methods by;
    tests/integration/server/test_openapi_document.py holds them unique."""
    return route.name


def complete(schema: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Adds the bearer scheme, the answers of the middleware, our 422 shape and the limits of `settings`
    to FastAPI's document."""
    _write_setting_limits(schema, settings)
    components = schema.setdefault("components", {})
    models = components.setdefault("schemas", {})
    for model in (ErrorOut, ValidationErrorOut):
        rendered = model.model_json_schema(ref_template="#/components/schemas/{model}")
        models.update(rendered.pop("$defs", {}))
        models[model.__name__] = rendered
    components["securitySchemes"] = SECURITY_SCHEMES
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            _use_our_422(responses)
            if "requestBody" in operation:
                responses.setdefault("413", BODY_TOO_LARGE)
                responses.setdefault("422", INVALID)
            if is_public(method.upper(), path):
                continue
            operation["security"] = [{BEARER_SCHEME: []}]
            responses.setdefault("401", UNAUTHENTICATED)
            responses.setdefault("403", FORBIDDEN)
    for unused in ("HTTPValidationError", "ValidationError"):
        models.pop(unused, None)
    return schema


def _write_setting_limits(node: Any, settings: Settings) -> None:
    """Replaces each SETTING_LIMIT marker (server/schemas/common.py) with the keywords it names, valued from
    `settings`: the document states the limits of this coordinator."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            _exact_integer_bounds(node)
        for keyword, setting in node.pop(SETTING_LIMIT, {}).items():
            value = getattr(settings, setting)  # the lower of the setting and the schema's own bound
            node[keyword] = min(value, node[keyword]) if keyword in node else value
        for value in node.values():
            _write_setting_limits(value, settings)
    elif isinstance(node, list):
        for value in node:
            _write_setting_limits(value, settings)


def _exact_integer_bounds(node: dict[str, Any]) -> None:
    """FastAPI's document model holds bounds as floats: 4096 becomes 4096.0 and INT64_MAX becomes 2**63,
    one more than is accepted. An integer's bounds are written back as integers; the only ones beyond a
    float's precision are INT64_MIN and INT64_MAX (server/limits.py)."""
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = node.get(keyword)
        if isinstance(value, float) and value.is_integer():
            if abs(value) >= _FLOAT_EXACT:
                node[keyword] = INT64_MAX if value > 0 else INT64_MIN
            else:
                node[keyword] = int(value)


def _use_our_422(responses: dict[str, Any]) -> None:
    """FastAPI documents its own 422 body; the handler sends ValidationErrorOut (server/api/errors.py)."""
    for content in responses.get("422", {}).get("content", {}).values():
        if content.get("schema", {}).get("$ref") == _FASTAPI_422:
            content["schema"] = {"$ref": "#/components/schemas/ValidationErrorOut"}


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Makes app.openapi() (and /openapi.json) return the completed document, built once."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(generate(), settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
