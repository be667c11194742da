"""Fixtures shared by every test package: one real local cluster per test session."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cluster import Cluster, free_port  # noqa: E402


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A coordinator and two agents (one CPU slot each) on loopback, shared by end-to-end tests."""
    root = tmp_path_factory.mktemp("cluster")
    instance = Cluster(root=root, http_port=free_port(), grpc_port=free_port())
    try:
        instance.start_server()
        instance.start_agent("e2e-1", 21000)
        instance.start_agent("e2e-2", 21100)
        yield instance
    finally:
        instance.stop()


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
