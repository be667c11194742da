"""A job's own Python environment, resolved once at submit with uv.

The submitter's file (a requirements.txt, a pyproject.toml, or a project's uv.lock) becomes a lock of
pinned requirements (mwms/environment_lock.py): `uv pip compile --universal` for the first two, `uv export
--frozen` for a uv.lock. The lock travels in the job's spec, so every worker of every attempt installs
exactly the same packages, whichever agent builds them and whenever. uv runs with the submitter's own
environment, so the index it resolves against is the one their uv or pip settings name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from mwms.environment_lock import ENVIRONMENT_FILES, LockError, pinned_packages
from mwms.errors import ConfigError, InvalidSpec

RESOLVE_TIMEOUT_S = 300.0
MAX_ERROR_CHARS = 1500


def find_uv() -> str:
    """The uv next to this Python (installed with mwms), else on PATH; ConfigError when there is none."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("uv")
    if found is None:
        raise ConfigError("uv is needed to resolve --requirements and is not installed: pip install uv")
    return found


def environment_file_in(directory: str | Path) -> Path | None:
    """The file of `directory` that names its environment (uv.lock, requirements.txt, pyproject.toml)."""
    for name in ENVIRONMENT_FILES:
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    return None


def _uv_command(uv: str, path: Path, python: str) -> list[str]:
    if path.name == "uv.lock":
        return [
            uv, "export", "--frozen", "--no-hashes", "--no-emit-project", "--no-header", "--no-dev",
            "--format", "requirements-txt", "--project", str(path.parent),
        ]  # fmt: skip
    return [
        uv, "pip", "compile", str(path), "--universal", "--no-header", "--no-annotate",
        "--python-version", python, "--quiet",
    ]  # fmt: skip


def resolve(
    directory: str | Path,
    requirements: str | Path,
    python: str | None = None,
    *,
    uv: str | None = None,
    isolated: bool = False,
) -> dict[str, Any]:
    """The spec's `environment` for `requirements` (relative to `directory` unless absolute): the file's
    name as shown, the Python asked for, the lock, and `isolated` when it must not extend the agents'
    runtime. The lock is resolved for Python `python` and newer
    (default: this Python's version). InvalidSpec with uv's own words when it cannot be resolved."""
    path = Path(requirements)
    if not path.is_absolute():
        path = Path(directory) / path
    if not path.is_file():
        raise InvalidSpec(f"--requirements {requirements}: no such file (a path relative to {directory})")
    floor = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        done = subprocess.run(
            _uv_command(uv or find_uv(), path.resolve(), floor),
            capture_output=True,
            text=True,
            timeout=RESOLVE_TIMEOUT_S,
            cwd=path.resolve().parent,
            env={**os.environ, "UV_NO_PROGRESS": "1"},
        )
    except subprocess.TimeoutExpired:
        raise InvalidSpec(
            f"resolving {path.name} took over {RESOLVE_TIMEOUT_S:.0f} s: check the package index"
        ) from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[-MAX_ERROR_CHARS:]
        raise InvalidSpec(f"{path.name} cannot be resolved: {said}")
    try:
        pinned_packages(done.stdout)
    except LockError as error:
        raise InvalidSpec(f"{path.name} resolved to a lock mwms cannot use: {error}") from None
    try:
        shown = str(path.resolve().relative_to(Path(directory).resolve()))
    except ValueError:
        shown = path.name
    environment: dict[str, Any] = {"requirements": shown, "locked": done.stdout}
    if python:
        environment["python"] = python
    if isolated:
        environment["isolated"] = True
    return environment
