"""Fixtures shared by every test package: one real local cluster per test session, one PostgreSQL server
for the replica tests, and a migrated coordinator database (`db`, seeded as a `db_seed` marker says)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cluster import Cluster  # noqa: E402

E2E_DIR = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ is in the e2e tier by where it lives, whatever its module declares:
    one without a marker would otherwise start a real cluster inside `make test-fast`."""
    for item in items:
        if E2E_DIR in item.path.parents and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "db_seed(digest, agents=()): the `db` fixture's database holds bundle `digest` and an online "
        "one-slot CPU agent per name",
    )


@pytest.fixture
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A migrated SQLite coordinator database in tmp_path, empty, or seeded as the closest `db_seed`
    marker (a module's `pytestmark` or a test's) says."""
    from coordinator_rows import seeded_database  # the server's packages, only for tests that ask

    seed = request.node.get_closest_marker("db_seed")
    digest, agents = (seed.args[0], seed.kwargs.get("agents", ())) if seed else (None, ())
    database = seeded_database(tmp_path / "coordinator.db", digest, agents)
    try:
        yield database
    finally:
        database.dispose()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A coordinator and two agents (one CPU slot each) on loopback, shared by end-to-end tests."""
    root = tmp_path_factory.mktemp("cluster")
    instance = Cluster(root=root)
    try:
        instance.start_server()
        instance.start_agent("e2e-1", 21000)
        instance.start_agent("e2e-2", 21100)
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL 15 server for the session's replica tests; each takes a database of its own
    (`postgres.create_database(name)`)."""
    from postgres_server import PostgresUnavailable, postgres_server

    pytest.importorskip("psycopg")
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as error:
        pytest.skip(str(error))


# Every scheduler pass, in-process or in a coordinator the tests start, fails on a job left waiting
# unexplained beside devices that fit it (server/services/scheduler/pass_check.py).
os.environ["MWMS_SCHEDULER_STRICT_CHECK"] = "1"

CHROMIUM = os.environ.get("MWMS_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """The chromium binary, installed with apt-get by browser/install_chromium.sh when it is missing."""
    if not os.access(CHROMIUM, os.X_OK):
        script = Path(__file__).parent / "browser" / "install_chromium.sh"
        result = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=900)
        if result.returncode != 0 or not os.access(CHROMIUM, os.X_OK):
            pytest.skip(f"chromium could not be installed ({script}): {result.stderr.strip()[-500:]}")
    return CHROMIUM


@pytest.fixture(scope="module")
def playwright_instance() -> Iterator[object]:
    """A sync Playwright for one test module.

    One at a time per process (a second one in the same thread cannot start), and ended with its module:
    while it runs it owns an event loop in this thread, so later tests could not call asyncio.run().
    """
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    with sync_api.sync_playwright() as playwright:
        yield playwright
