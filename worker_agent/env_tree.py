"""A job's environment as a tree on disk: the runtime files the agent lays over its site-packages
(mwms_runtime and the runtime's share of mwms), sealing it read-only and marking it complete, its size,
and removing it. worker_agent/environments.py builds and caches the trees."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

COMPLETE = ".mwms-complete"
LAST_USED = ".mwms-last-used"
# The modules of mwms that mwms_runtime imports (task_environment imports preflight_contract): stdlib only.
SHARED_MODULES = ("task_environment.py", "metrics_line.py", "preflight_contract.py")
SHARED_INIT = (
    b'"""The runtime\'s share of mwms: the modules mwms_runtime imports, copied in by the agent."""\n'
)


def _runtime_files() -> dict[str, bytes]:
    """The overlay, by path under site-packages: mwms_runtime and the runtime's share of mwms.

    Found with find_spec, not imported: importing mwms_runtime would load numpy into the agent and set
    the tasks' defaults in the agent's own environment."""
    files: dict[str, bytes] = {"mwms/__init__.py": SHARED_INIT}
    for package in ("mwms_runtime", "mwms"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        directory = Path(next(iter(spec.submodule_search_locations)))
        if package == "mwms":
            files.update({f"mwms/{name}": (directory / name).read_bytes() for name in SHARED_MODULES})
            continue
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files[f"mwms_runtime/{path.relative_to(directory).as_posix()}"] = path.read_bytes()
    return files


RUNTIME_FILES = _runtime_files()
RUNTIME_DIGEST = hashlib.sha256(
    b"".join(name.encode() + b"\0" + hashlib.sha256(data).digest() for name, data in RUNTIME_FILES.items())
).hexdigest()


def _overlay(purelib: Path, log_line: Callable[[str], None]) -> None:
    """Writes mwms_runtime and the runtime's share of mwms into site-packages (over any the lock brought)."""
    for package in ("mwms_runtime", "mwms"):
        if (purelib / package).exists():
            log_line(f"the job's lock installs {package}; the agent's own replaces it")
            shutil.rmtree(purelib / package)
    for name, data in RUNTIME_FILES.items():
        (purelib / name).parent.mkdir(parents=True, exist_ok=True)
        (purelib / name).write_bytes(data)


def _seal(prefix: Path, key: str, facts: dict[str, object]) -> None:
    """Makes the tree read-only (dirs 0555, files 0444 or 0555), then marks it complete, its top last."""
    for directory, dirnames, filenames in os.walk(prefix, topdown=False):
        for name in [*filenames, *dirnames]:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode):  # a link's target (bin/python: the base interpreter) is not ours
                os.chmod(path, 0o555 if stat.S_ISDIR(mode) or mode & 0o111 else 0o444)
    (prefix / LAST_USED).touch(mode=0o444)
    marker = {"key": key, **facts, "bytes": _size(prefix), "created": time.time()}
    (prefix / f"{COMPLETE}.partial").write_text(json.dumps(marker) + "\n")
    os.chmod(prefix / f"{COMPLETE}.partial", 0o444)
    os.replace(prefix / f"{COMPLETE}.partial", prefix / COMPLETE)
    os.chmod(prefix, 0o555)


def _size(prefix: Path) -> int:
    """Bytes of the files under `prefix`, links not followed."""
    total = 0
    for directory, _, filenames in os.walk(prefix):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def remove_tree(prefix: Path) -> None:
    """Removes an environment (sealed, partial or absent): its marker first, so a crash leaves it incomplete."""
    if not os.path.lexists(prefix):
        return
    if prefix.is_symlink() or not prefix.is_dir():
        prefix.unlink()
        return
    os.chmod(prefix, 0o755)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(prefix / COMPLETE)
    for directory, _, _ in os.walk(prefix):  # links are not followed: their targets are not ours
        os.chmod(directory, 0o755)
    shutil.rmtree(prefix)
