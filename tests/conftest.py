"""Fixtures shared by every test package: one real local cluster per test session, one PostgreSQL server
for the replica tests, and a migrated coordinator database (`db`, seeded as a `db_seed` marker says)."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mwms_testkit import parallel, tiers
from mwms_testkit.cluster import NO_WARM_POOL, Cluster

TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is in the tier of the folder it lives in (mwms_testkit/tiers.py); one that starts processes
    outside tests/system, or lives outside every tier, fails the collection with where to move it."""
    problems = tiers.collection_problems(items, TESTS)
    if problems:
        raise pytest.UsageError("tests in the wrong tier:\n  " + "\n  ".join(problems))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Longest modules first, so the workers end together (mwms_testkit/parallel.py); stable, so each
        # module keeps its tests' order. Every worker sorts the same way, as pytest-xdist requires.
        items.sort(key=lambda item: parallel.schedule_rank(item.path.relative_to(TESTS).as_posix()))


_ALONE_LOCK = (
    parallel.AloneLock(tempfile.gettempdir(), os.environ["PYTEST_XDIST_TESTRUNUID"])
    if os.environ.get("PYTEST_XDIST_TESTRUNUID")
    else None
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Under pytest-xdist (`make test`), a test marked `alone` runs while the other workers wait between
    their tests (mwms_testkit/parallel.py AloneLock); the others run side by side."""
    if _ALONE_LOCK is None:
        return (yield)
    _ALONE_LOCK.acquire(alone=item.get_closest_marker("alone") is not None)
    try:
        return (yield)
    finally:
        _ALONE_LOCK.release()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "alone: bounds latencies or durations; under pytest-xdist it runs while no other test does",
    )
    for tier in tiers.TIERS:
        config.addinivalue_line(
            "markers", f"{tier}: the test lives in tests/{tier} (set by tests/conftest.py)"
        )
    config.addinivalue_line(
        "markers",
        "db_seed(digest, agents=()): the `db` fixture's database holds bundle `digest` and an online "
        "one-slot CPU agent per name",
    )


@pytest.fixture
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A migrated SQLite coordinator database in tmp_path, empty, or seeded as the closest `db_seed`
    marker (a module's `pytestmark` or a test's) says."""
    from mwms_testkit.coordinator_rows import (
        seeded_database,  # the server's packages, only for tests that ask
    )

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
    from mwms_testkit.postgres_server import PostgresUnavailable, postgres_server

    pytest.importorskip("psycopg")
    try:
        with postgres_server() as server:
            yield server
    except PostgresUnavailable as error:
        pytest.skip(str(error))


# Every scheduler pass, in-process or in a coordinator the tests start, fails on a job left waiting
# unexplained beside devices that fit it (server/services/scheduler/pass_check.py).
os.environ["MWMS_SCHEDULER_STRICT_CHECK"] = "1"
# Agents the tests start, by hand or through the scaffolding, keep no warm interpreters (each imports
# TensorFlow while the suite's programs are tiny); the warm pool's own tests pass --warm-pool, which wins.
os.environ.update(NO_WARM_POOL)
# pytest-xdist's workers (`make test`) start with COLUMNS=80 and LINES=24 set, which would draw the CLI's
# tables (mwms/cli/formatting.py) as narrow as a terminal's: the suite reads them as a pipe's, as in one process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

CHROMIUM = os.environ.get("MWMS_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    """The chromium binary, installed with apt-get by browser/install_chromium.sh when it is missing."""
    if not os.access(CHROMIUM, os.X_OK):
        script = TESTS / "system" / "browser" / "install_chromium.sh"
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


@pytest.fixture(autouse=True)
def _daemon_log_handlers_removed() -> Iterator[None]:
    """A daemon command run in the test process (CliRunner) installs its log handler on that run's
    captured stderr (mwms/log_setup.py); it ends with the test, before a later one logs into a closed file."""
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_mwms_log_setup", False)]:
        root.removeHandler(handler)
