"""The suite's three tiers, by where a test lives, and what keeps each tier honest.

- tests/unit: no process, no socket, no server: a function, a class, a SQLite file.
- tests/integration: a coordinator inside the test process, fake APIs, gRPC and HTTP on loopback; still no
  process (the coordinator's scheduler and ingest work run in its own process's threads here).
- tests/system: processes: real coordinators and agents, TensorFlow, a browser, packaging, PostgreSQL.

A module outside tests/system that imports what starts processes, or a test there that asks for a fixture that
does, fails at collection (`collection_problems`); what slips past that (code under test that spawns one)
fails when it runs (`refuse_processes`, `refuse_sockets`, autouse fixtures of the tiers' conftest.py).
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "system")
FAST_TIERS = ("unit", "integration")

# Imports that start processes (or stand for a tool that does), and why.
PROCESS_IMPORTS = {
    "subprocess": "runs programs",
    "multiprocessing": "starts processes",
    "pty": "starts processes on a terminal",
    "playwright": "drives a browser",
    "tensorflow": "belongs in a task's process",
    "mwms_testkit.cluster.Cluster": "starts a coordinator and agents",
    "mwms_testkit.cluster.Process": "starts processes",
    "mwms_testkit.replica_cluster": "starts coordinator replicas",
    "mwms_testkit.runtime_cluster": "starts TensorFlow workers",
    "mwms_testkit.fake_gpus": "starts agents with stand-in GPUs",
    "mwms_testkit.postgres_server": "starts PostgreSQL",
    "mwms_testkit.netns": "runs ip and unshare",
}
# Session fixtures (tests/conftest.py) that start processes.
PROCESS_FIXTURES = {"cluster", "postgres", "chromium_executable", "playwright_instance"}
# The coordinator's scheduler and ingest work in threads of the test process, not processes of their own.
IN_PROCESS_COORDINATOR_ENV = {"MWMS_SCHEDULER_PROCESS": "false", "MWMS_INGEST_PROCESS": "false"}


def tier_of(path: Path, tests_dir: Path) -> str | None:
    """The tier of a test file under `tests_dir` (None: outside every tier)."""
    try:
        first = path.relative_to(tests_dir).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in TIERS else None


def imported_names(source: str) -> set[str]:
    """Every module a source imports, and every `module.name` it imports from one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def process_imports(source: str) -> list[str]:
    """What of PROCESS_IMPORTS a source imports, and which process fixtures it asks for by name
    (request.getfixturevalue), each with why it belongs in tests/system."""
    names = imported_names(source)
    found = [
        f"imports {listed} ({why})"
        for listed, why in PROCESS_IMPORTS.items()
        if any(name == listed or name.startswith(listed + ".") for name in names)
    ]
    found += [f"asks for the {name!r} fixture (it starts processes)" for name in fixtures_asked_for(source)]
    return found


def fixtures_asked_for(source: str) -> list[str]:
    """The PROCESS_FIXTURES a source asks for by name: request.getfixturevalue("postgres")."""
    asked = {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "getfixturevalue"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    return sorted(asked & PROCESS_FIXTURES)


def collection_problems(items: Iterable[pytest.Item], tests_dir: Path) -> list[str]:
    """Why collected tests are in the wrong place: outside every tier, or starting processes outside
    tests/system. Also marks each test with its tier (`-m unit`, `-m "not system"`)."""
    problems: list[str] = []
    checked: dict[Path, str | None] = {}
    for item in items:
        path = Path(item.path)
        if path not in checked:
            checked[path] = tier = tier_of(path, tests_dir)
            where = path.relative_to(tests_dir) if tests_dir in path.parents else path
            if tier is None:
                problems.append(
                    f"tests/{where}: a test lives in tests/unit, tests/integration or tests/system"
                )
            elif tier != "system":
                reasons = process_imports(path.read_text())
                if reasons:
                    problems.append(f"tests/{where} {'; '.join(reasons)}: move it to tests/system")
        tier = checked[path]
        if tier is None:
            continue
        item.add_marker(tier)
        if tier != "system":
            for fixture in sorted(PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))):
                problems.append(
                    f"{item.nodeid} uses the {fixture!r} fixture, which starts processes: move it to tests/system"
                )
    return problems


class TierViolation(AssertionError):
    """A test did what its tier does not allow."""


def refuse_processes(monkeypatch: pytest.MonkeyPatch, tier: str) -> None:
    """Any process the test starts (subprocess, asyncio, multiprocessing, fork) fails it, by name."""

    def refused(*args: object, **kwargs: object) -> None:
        shown = args[1] if len(args) > 1 else kwargs.get("args", "a process")
        raise TierViolation(f"a test in tests/{tier} started {shown!r}: processes belong in tests/system")

    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refused)


def refuse_sockets(monkeypatch: pytest.MonkeyPatch, tier: str) -> None:
    """Any network or unix socket the test binds or connects fails it (socketpairs, as asyncio's, stay)."""
    for method in ("bind", "connect", "connect_ex", "listen"):
        original = getattr(socket.socket, method)

        def refused(
            self: socket.socket, *args: object, _original: object = original, _m: str = method
        ) -> object:
            if self.family in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):
                raise TierViolation(
                    f"a test in tests/{tier} used a socket ({_m} {args[0] if args else ''}): "
                    "sockets and servers belong in tests/integration"
                )
            return _original(self, *args)  # type: ignore[operator]

        monkeypatch.setattr(socket.socket, method, refused)


def in_process_coordinators(monkeypatch: pytest.MonkeyPatch) -> None:
    """Coordinators the test starts plan and store telemetry in their own threads."""
    for name, value in IN_PROCESS_COORDINATOR_ENV.items():
        monkeypatch.setenv(name, value)
