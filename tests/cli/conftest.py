"""Fixtures for CLI tests: a real HTTP fake of the API on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_fake_api import FakeState, serve_fake_api


@pytest.fixture
def fake_api() -> Iterator[tuple[str, FakeState]]:
    with serve_fake_api() as served:
        yield served
