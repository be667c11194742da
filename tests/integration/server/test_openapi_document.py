"""The OpenAPI document that generated clients and Swagger's Authorize button rely on: short, unique
operation ids, the bearer scheme on every operation the middleware guards (and on no public one), 401 and
403 declared with the body the API sends, and the rules the code enforces written in the schema."""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

import pytest
from fastapi.routing import APIRoute
from pydantic import ValidationError

import mwms.server.api
from mwms.server.api.auth import is_public
from mwms.server.api.openapi_document import BEARER_SCHEME
from mwms.server.app import create_app
from mwms.server.errors import InvalidInput
from mwms.server.schema_types import NAME_PATTERN, PRINTABLE_PATTERN
from mwms.server.schemas import JoinTokenCreate, TokenCreate
from mwms.server.services.auth import tokens
from mwms.server.services.auth.tokens import Role
from mwms.server.services.scheduler import teams
from mwms.server.settings import Settings

METHODS = {"get", "put", "post", "delete", "patch"}
# Strings at the edges of the name rule: blank, whitespace around, control characters, line breaks.
NAMES = [
    "alice",
    "José Müller",
    " alice\n",
    "\talice\t",
    "\u3000alice\u2000",
    "",
    " ",
    "\u3000",
    "a\nb",
    "a\x00b",
    "a\x7fb",
    "a\x85b",
    "a\u2028b",
    "a\xadb",
    "a\ue000b",
    "x" * 200,
    "x" * 201,
    " " + "x" * 199,
]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("openapi")))


@pytest.fixture(scope="module")
def document(app: Any) -> dict[str, Any]:
    return app.openapi()


def api_routes() -> list[APIRoute]:
    """Every route of the REST routers (server/api/*.py `router`)."""
    found = []
    for module in pkgutil.iter_modules(mwms.server.api.__path__):
        router = getattr(importlib.import_module(f"mwms.server.api.{module.name}"), "router", None)
        if router is not None:
            found += [route for route in router.routes if isinstance(route, APIRoute)]
    return found


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def test_operation_ids_are_the_route_names_and_unique(document: dict[str, Any]) -> None:
    ids = [operation["operationId"] for _, _, operation in operations(document)]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert set(ids) == {route.name for route in api_routes() if route.include_in_schema}
    assert {"list_jobs", "get_job", "cancel_job", "list_agents", "upload_bundle", "create_api_token"} <= set(
        ids
    )
    for operation_id in ids:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", operation_id) and len(operation_id) <= 30, operation_id


def test_every_protected_operation_declares_the_bearer_scheme_and_401_403(document: dict[str, Any]) -> None:
    scheme = document["components"]["securitySchemes"][BEARER_SCHEME]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    error_body = {"$ref": "#/components/schemas/ErrorOut"}
    protected = 0
    for method, path, operation in operations(document):
        if is_public(method.upper(), path):
            assert "security" not in operation, (method, path)
            continue
        protected += 1
        assert operation["security"] == [{BEARER_SCHEME: []}], (method, path)
        for status in ("401", "403"):
            answer = operation["responses"][status]
            assert answer["content"]["application/json"]["schema"] == error_body, (method, path, status)
    assert protected >= 35
    public = {(m, p) for m, p, _ in operations(document) if is_public(m.upper(), p)}
    assert public == {("get", "/healthz"), ("post", "/api/v1/session")}
    assert document["components"]["schemas"]["ErrorOut"]["required"] == ["detail"]


def test_every_body_documents_its_refusals(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        if "requestBody" not in operation:
            continue
        responses = operation["responses"]
        assert "413" in responses and "422" in responses, (method, path)
        ref = responses["422"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/ValidationErrorOut", (method, path)


def test_the_bundle_upload_declares_content_types_generators_know(document: dict[str, Any]) -> None:
    upload = document["paths"]["/api/v1/bundles"]["post"]
    content = upload["requestBody"]["content"]
    assert set(content) == {"multipart/form-data"}
    file_field = content["multipart/form-data"]["schema"]["properties"]["file"]
    assert file_field["type"] == "string" and file_field["format"] == "binary"
    assert "archive" in upload["responses"]["400"]["description"]


def test_the_last_admin_refusal_and_the_ndjson_follow_are_documented(document: dict[str, Any]) -> None:
    assert "409" in document["paths"]["/api/v1/tokens/{token_id}"]["delete"]["responses"]
    logs = document["paths"]["/api/v1/jobs/{job_id}/logs"]["get"]["responses"]["200"]["content"]
    assert set(logs) == {"application/json", "application/x-ndjson"}


def test_the_name_rule_is_the_schema_pattern(db: Any) -> None:
    """Whatever the schema lets through, the service stores; whatever it refuses, the service refuses."""
    for name in NAMES:
        try:
            TokenCreate(user=name)
            JoinTokenCreate(name=name)
            schema_ok = True
        except ValidationError:
            schema_ok = False
        with db.write() as session:
            try:
                token, _ = tokens.create_api_token(session, name, Role.USER)
                tokens.create_join_token(session, name)
                service_ok = True
                assert token.user == name.strip()
            except InvalidInput as error:
                service_ok = False
                assert "printable" in str(error)
        assert schema_ok == service_ok, repr(name)
        # What a client or generator validating with the JSON pattern decides (Python's re semantics).
        assert bool(re.fullmatch(NAME_PATTERN, name)) == schema_ok or len(name) > 200, repr(name)
        # A team's and a user's name in a path follow the same rule (server/services/scheduler/teams.py).
        with db.write() as session:
            try:
                teams.add_member(session, name, "someone", by="admin")
                team_ok = True
            except InvalidInput:
                team_ok = False
        # What the service refuses the schema refuses; the schema refuses control characters that the
        # service would strip from around a name (" alice\n") too.
        assert team_ok or not schema_ok, repr(name)
    assert TokenCreate(user="ann", name="").name == ""
    with pytest.raises(ValidationError):
        TokenCreate(user="ann", name="  ")


def test_the_printable_pattern_is_str_isprintable_in_the_bmp() -> None:
    printable = re.compile(PRINTABLE_PATTERN)
    wrong = [hex(c) for c in range(0x10000) if bool(printable.fullmatch(chr(c))) != chr(c).isprintable()]
    assert not wrong, wrong[:20]
    assert not printable.fullmatch("\U0001f600")  # beyond the BMP: refused by the schema itself
