"""Fixtures shared by every test package: one real local cluster per test session."""

from __future__ import annotations

import sys
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
