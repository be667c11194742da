"""Fixtures for the Python client's tests (their conftest.py files import them): no caller settings leak
in, and the CLI's fake API serves them."""

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
def fake_api() -> Iterator[tuple[str, FakeState]]:
    """The CLI tests' fake API on a free port: (its address, its state)."""
    with serve_fake_api() as served:
        yield served


@pytest.fixture
def user_token() -> str:
    return USER_TOKEN


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """A one-file program directory."""
    directory = tmp_path / "my-program"
    directory.mkdir()
    (directory / "train.py").write_text("print('training')\n")
    return directory
