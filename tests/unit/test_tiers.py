"""The tiers hold: what a unit or integration module imports that starts processes is found, and what a test of
those tiers starts anyway is refused when it runs (mwms_testkit/tiers.py; the collection itself is
tests/system/test_tier_collection.py)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from mwms_testkit import tiers


def test_the_tier_is_the_first_folder_under_tests() -> None:
    root = Path("/repo/tests")
    assert tiers.tier_of(root / "unit" / "server" / "test_x.py", root) == "unit"
    assert tiers.tier_of(root / "system" / "e2e" / "test_x.py", root) == "system"
    assert tiers.tier_of(root / "server" / "test_x.py", root) is None
    assert tiers.tier_of(Path("/elsewhere/test_x.py"), root) is None


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import subprocess\n", "imports subprocess"),
        ("from subprocess import run\n", "imports subprocess"),
        ("import multiprocessing.pool\n", "imports multiprocessing"),
        ("from mwms_testkit.cluster import Cluster, wait_until\n", "imports mwms_testkit.cluster.Cluster"),
        (
            "from mwms_testkit.postgres_server import postgres_server\n",
            "imports mwms_testkit.postgres_server",
        ),
        (
            "def f(request):\n    request." + "getfixturevalue('postgres')\n",
            "asks for the 'postgres' fixture",
        ),
    ],
)
def test_what_starts_processes_is_found(source: str, found: str) -> None:
    assert [reason for reason in tiers.process_imports(source) if reason.startswith(found)]


def test_helpers_that_start_nothing_pass() -> None:
    source = "import socket\nfrom mwms_testkit.cluster import wait_until, pack\nimport subprocessing_like\n"
    assert tiers.process_imports(source) == []


def test_a_process_started_in_the_unit_tier_is_refused_by_name() -> None:
    async def start() -> None:
        await asyncio.create_subprocess_exec("true")

    with pytest.raises(tiers.TierViolation, match="tests/unit started .*processes belong in tests/system"):
        asyncio.run(start())


def test_a_socket_in_the_unit_tier_is_refused() -> None:
    with pytest.raises(tiers.TierViolation, match="belong in tests/integration"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    left, right = socket.socketpair()  # no network: allowed (asyncio's loops make one)
    left.close()
    right.close()
