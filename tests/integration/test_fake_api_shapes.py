"""The fake REST API (testkit/mwms_testkit/fake_api/) answers what the coordinator declares.

Every path and method the fake serves is one of the coordinator's, and each of its success responses has the
schema the coordinator's OpenAPI document gives that path, method and status, the models it names inlined.
The fake's routes validate what they answer against those models, so a fake that drifts from the coordinator
fails here or in the tests that call it.
"""

from __future__ import annotations

from typing import Any

import pytest

from mwms.server.api.openapi_document import complete
from mwms.server.app import create_app as create_coordinator_app
from mwms.server.settings import Settings
from mwms_testkit.fake_api import FakeState, create_app

METHODS = {"get", "put", "post", "delete", "patch", "head"}


def _inlined(schema: Any, components: dict[str, Any]) -> Any:
    """`schema` with every $ref replaced by the component it names, titles left out (FastAPI names a list
    response after its function)."""
    if isinstance(schema, list):
        return [_inlined(item, components) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return {"model": name, **_inlined(components[name], {**components, name: {"recursive": name}})}
    return {key: _inlined(value, components) for key, value in schema.items() if key != "title"}


def _success_responses(document: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    """status -> media type -> inlined schema, for the 2xx responses of an operation."""
    components = document.get("components", {}).get("schemas", {})
    responses = document["paths"][path][method].get("responses", {})
    return {
        status: {
            media: _inlined(content.get("schema"), components)
            for media, content in response.get("content", {}).items()
        }
        for status, response in responses.items()
        if status.startswith("2")
    }


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("coordinator"))
    real = create_coordinator_app(settings).openapi()
    # The coordinator writes its settings' limits into its document: the fake's gets the same.
    return real, complete(create_app(FakeState()).openapi(), settings)


def _operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (path, method) for path, item in document["paths"].items() for method in item if method in METHODS
    ]


def test_the_fake_serves_only_the_coordinators_paths_and_methods(documents) -> None:
    real, fake = documents
    served = _operations(fake)
    assert len(served) >= 25, served
    unknown = [
        f"{method.upper()} {path}" for path, method in served if method not in real["paths"].get(path, {})
    ]
    assert not unknown, f"the fake serves what the coordinator does not: {unknown}"


def test_every_route_of_the_fake_answers_the_coordinators_response_model(documents) -> None:
    real, fake = documents
    for path, method in _operations(fake):
        theirs, ours = _success_responses(real, path, method), _success_responses(fake, path, method)
        assert ours, f"{method.upper()} {path}: the fake declares no success response"
        for status, media_types in ours.items():
            assert status in theirs, f"{method.upper()} {path}: the coordinator never answers {status}"
            for media, schema in media_types.items():
                expected = theirs[status].get(media)
                assert schema == expected, f"{method.upper()} {path} {status} {media}: {schema} != {expected}"


def test_a_drifted_answer_fails_loudly() -> None:
    """A job missing a field JobOut requires is a 500, not a shape the CLI would have to guess at."""
    from fastapi.testclient import TestClient

    from mwms_testkit.fake_api import ADMIN_TOKEN, T0, FakeJob

    class Drifted(FakeJob):
        def detail(self) -> dict[str, Any]:
            return {key: value for key, value in super().detail().items() if key != "bundle_digest"}

    state = FakeState()
    state.jobs["drifted"] = Drifted("drifted", "drifted", "RUNNING", T0)
    client = TestClient(create_app(state), raise_server_exceptions=False)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert client.get("/api/v1/jobs/drifted", headers=headers).status_code == 500
    assert client.get("/api/v1/jobs", headers=headers).status_code == 200  # the summary has no digest
