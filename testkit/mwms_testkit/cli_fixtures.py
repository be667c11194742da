"""Fixtures for the CLI's tests (their conftest.py files import them): a real HTTP fake of the API on a free
port, and a private config directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms_testkit.fake_api import USER_TOKEN, FakeState, serve_fake_api

CONNECTION_ENV = ("MWMS_API", "MWMS_TOKEN", "MWMS_CA_FILE", "MWMS_CONFIG")


@pytest.fixture(autouse=True)
def private_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test has its own config home and none of the caller's MWMS_* connection settings."""
    for name in CONNECTION_ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "config-home"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home / "mwms" / "config.json"


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FakeState]]:
    """The fake API; commands send USER_TOKEN (through MWMS_TOKEN) unless a test says otherwise."""
    monkeypatch.setenv("MWMS_TOKEN", USER_TOKEN)
    with serve_fake_api() as served:
        yield served
