"""The jobs' own Python environments, built with uv once per machine and key, and shared by every task.

A job brings a lock (pinned requirements); the agent builds `envs/<key>` from it with `uv venv` and `uv pip
sync` (wheels only, unless the operator allows source builds: nothing of the job's runs as the agent),
adds mwms_runtime and the few modules of mwms it imports, byte-compiles it all, and seals the tree
read-only. By default the environment extends the agent's own runtime: a `.pth` file puts the agent's
site-packages after the environment's own, so TensorFlow, tf-keras and numpy stay importable and the lock's
packages come first (as `--system-site-packages` would for the system's). An isolated environment holds
the lock alone: tasks run as other uids, so they may read and run it but never change what the next
job of that key runs. `.mwms-complete`, written last, marks a whole environment; anything else is rebuilt.

Several agent processes may share the root, so the locks are flocks: `locks/<key>.build` (exclusive, one
build per key, the others wait and reuse it) and `locks/<key>.use` (shared while a task runs in it).
Eviction removes the least recently used environments over `max_bytes` that no one holds.

Running uv and reading its failures is worker_agent/env_build.py's; the tree on disk (the runtime overlay,
sealing, removing) worker_agent/env_tree.py's.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import site
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mwms.worker_agent.env_build import PURELIB_QUERY, _Output, compile_bytecode, run_python, uv_run
from mwms.worker_agent.env_build import EnvironmentBuildError as EnvironmentBuildError
from mwms.worker_agent.env_tree import COMPLETE, LAST_USED, RUNTIME_DIGEST, _overlay, _seal, _size
from mwms.worker_agent.env_tree import remove_tree as remove_tree

log = logging.getLogger("mwms.agent.environments")

KEY_FORMAT = "mwms-environment-2"
# In site-packages of an environment that extends the agent's runtime: the agent's site-packages, one per
# line, which Python's site module appends after the environment's own (their .pth files are not run).
BASE_PTH = "_mwms_agent_runtime.pth"


def runtime_base() -> tuple[tuple[str, ...], str]:
    """The agent's own site-packages, which a job's environment extends, and a digest of what they hold
    (their paths and the name-version of every installed distribution): an agent whose TensorFlow was
    upgraded builds its environments anew. Directory listings only, cheap enough for every key."""
    directories = tuple(os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p))
    installed: list[str] = []
    for directory in directories:
        with contextlib.suppress(OSError):
            installed += sorted(name for name in os.listdir(directory) if name.endswith(".dist-info"))
    digest = hashlib.sha256("\0".join((*directories, "", *installed)).encode()).hexdigest()
    return directories, digest


@dataclass(frozen=True)
class EnvironmentSpec:
    """A job's environment: its lock, the Python it asks for ("" = the agent's own interpreter), and
    whether it holds the lock alone (`isolated`) or extends the agent's runtime."""

    locked: str
    python: str = ""
    isolated: bool = False

    def key(self) -> str:
        """The cache key: what the built tree depends on (comments and blank lines of the lock do not)."""
        lines = (line.rstrip() for line in self.locked.splitlines())
        locked = "\n".join(line for line in lines if line and not line.lstrip().startswith("#"))
        python = self.python or f"agent-{platform.python_version()}"  # an agent on a new Python builds anew
        base = "isolated" if self.isolated else f"extends-{runtime_base()[1]}"
        parts = (KEY_FORMAT, locked, python, platform.machine(), sys.platform, RUNTIME_DIGEST, base)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@dataclass
class Environment:
    """A built environment in use by one task, until `EnvironmentCache.release`."""

    key: str
    prefix: Path
    python: Path
    built: bool
    build_seconds: float
    use_fd: int | None = field(default=None, repr=False, compare=False)
    # What it holds (name==version, sorted) and the Python it runs, from its marker.
    packages: tuple[str, ...] = ()
    python_version: str = ""
    # The agent's site-packages it extends (after its own); empty: it holds its lock alone.
    extends: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        """sha256 of the installed packages: workers whose digests differ would run different code."""
        return hashlib.sha256("\n".join(self.packages).encode()).hexdigest()

    @property
    def platform(self) -> str:
        """The interpreter and platform it was built for, e.g. "CPython 3.11.7 linux x86_64"."""
        return f"{platform.python_implementation()} {self.python_version} {sys.platform} {platform.machine()}"


class EnvironmentCache:
    """Environments under `root`, built with uv, evicted least recently used above `max_bytes` (0: never)."""

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        uv: str | None = None,
        build_timeout_s: float = 1800.0,
        source_builds: bool = False,
    ) -> None:
        self.root = root
        self._source_builds = source_builds
        self._envs = root / "envs"
        self._locks = root / "locks"
        self._max_bytes = max_bytes
        self._uv = uv or shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
        self._timeout = build_timeout_s
        self._in_use: collections.Counter[str] = collections.Counter()
        self._guard = threading.Lock()

    def acquire(self, spec: EnvironmentSpec, log: Callable[[str], None]) -> Environment:
        """The environment of `spec`, built now or taken from the cache; release it when the task ends."""
        key = spec.key()
        self._prepare()
        with _flock(self._locks / f"{key}.build", fcntl.LOCK_EX) as held:
            assert held
            prefix = self._envs / key
            marker = self._marker(key)
            if marker is not None and (prefix / "bin" / "python").exists():
                os.utime(prefix / LAST_USED)
                log(f"environment {key[:12]} ready from the cache (no install)")
                env = Environment(key, prefix, prefix / "bin" / "python", False, 0.0)
                env.packages = tuple(str(p) for p in marker.get("packages") or ())
                env.python_version = str(marker.get("python") or "")
                env.extends = tuple(str(p) for p in marker.get("extends") or ())
            else:
                env = self._build(key, spec, log)
            env.use_fd = _open_lock(self._locks / f"{key}.use")
            fcntl.flock(env.use_fd, fcntl.LOCK_SH)
            with self._guard:
                self._in_use[key] += 1
        if env.built:
            self._evict(keep=key)
        return env

    def release(self, env: Environment) -> None:
        """Ends a task's use of `env` (once; later calls do nothing)."""
        if env.use_fd is None:
            return
        with contextlib.suppress(OSError):
            os.utime(env.prefix / LAST_USED)
        os.close(env.use_fd)
        env.use_fd = None
        with self._guard:
            self._in_use[env.key] -= 1

    def entries(self) -> list[tuple[str, int, float]]:
        """(key, size in bytes, last used) of every complete environment."""
        found: list[tuple[str, int, float]] = []
        for prefix in sorted(self._envs.iterdir()) if self._envs.is_dir() else []:
            marker = self._marker(prefix.name)
            if marker is not None:
                with contextlib.suppress(OSError):
                    used = (prefix / LAST_USED).stat().st_mtime
                    found.append((prefix.name, int(marker.get("bytes") or _size(prefix)), used))
        return found

    def _prepare(self) -> None:
        """root 0755; envs 0711 (tasks reach their environment, list no other); locks the agent's alone."""
        for path, mode in ((self.root, 0o755), (self._envs, 0o711), (self._locks, 0o700)):
            path.mkdir(mode=mode, parents=True, exist_ok=True)
            os.chmod(path, mode)  # also under a stricter umask

    def _marker(self, key: str) -> dict[str, Any] | None:
        try:
            marker = json.loads((self._envs / key / COMPLETE).read_text())
        except (OSError, ValueError):
            return None
        return marker if isinstance(marker, dict) and marker.get("key") == key else None

    def _build(self, key: str, spec: EnvironmentSpec, log_line: Callable[[str], None]) -> Environment:
        if not self._uv or not os.access(self._uv, os.X_OK):
            raise EnvironmentBuildError(
                f"uv is not installed on this agent ({self._uv or 'not on PATH'}), and jobs with an environment "
                "need it: `pip install uv` into the agent's environment",
                retryable=False,
            )
        prefix, python, started = self._envs / key, self._envs / key / "bin" / "python", time.monotonic()
        deadline, out = started + self._timeout, _Output(log_line)
        remove_tree(prefix)
        try:
            with tempfile.TemporaryDirectory(prefix="mwms-env-") as private:  # 0700: the lock is the job's
                (Path(private) / "requirements.txt").write_text(spec.locked)
                venv = ["venv", "--python", spec.python or sys.executable, str(prefix)]
                uv_run(self._uv, venv, spec.python, out, deadline, private, self._timeout)
                query = run_python(python, PURELIB_QUERY, deadline, private, self._timeout)
                purelib, version = query.split("\n")[:2]
                sync = ["pip", "sync", "--python", str(python), "requirements.txt"]
                if not self._source_builds:
                    sync.insert(2, "--no-build")  # uv's UV_NO_BUILD does not reach `pip sync`
                uv_run(self._uv, sync, "", out, deadline, private, self._timeout)
                _overlay(Path(purelib), log_line)
                extends = () if spec.isolated else _extend(Path(purelib), version, log_line)
                compile_bytecode(Path(purelib), version, deadline, log_line, self._timeout)
            seconds = time.monotonic() - started
            packages = sorted("==".join(p.stem.rsplit("-", 1)) for p in Path(purelib).glob("*.dist-info"))
            facts = {"python": version, "packages": packages, "build_seconds": round(seconds, 1)}
            _seal(prefix, key, {**facts, "extends": list(extends)})
        except BaseException:
            remove_tree(prefix)
            raise
        what = "isolated" if not extends else "extends the agent's runtime"
        log_line(f"environment {key[:12]} built in {seconds:.1f} s: {len(packages)} packages ({what})")
        return Environment(
            key,
            prefix,
            python,
            True,
            seconds,
            packages=tuple(packages),
            python_version=version,
            extends=extends,
        )

    def _evict(self, keep: str) -> None:
        """Removes least recently used environments no one holds until the rest fit in max_bytes."""
        if not self._max_bytes:
            return
        entries = sorted(self.entries(), key=lambda entry: entry[2])
        total = sum(size for _, size, _ in entries)
        for key, size, _ in entries:
            if total <= self._max_bytes:
                return
            with self._guard:
                busy = key == keep or self._in_use[key] > 0
            if not busy and self._remove_unused(key):
                log.info("evicted environment %s (%d bytes, least recently used)", key[:12], size)
                total -= size

    def _remove_unused(self, key: str) -> bool:
        """Removes environment `key` if no process builds or uses it (flocks held while removing)."""
        with _flock(self._locks / f"{key}.build", fcntl.LOCK_EX | fcntl.LOCK_NB) as building:
            with _flock(self._locks / f"{key}.use", fcntl.LOCK_EX | fcntl.LOCK_NB) as using:
                if not (building and using and self._marker(key) is not None):
                    return False
                remove_tree(self._envs / key)
                return True


@contextlib.contextmanager
def _flock(path: Path, operation: int) -> Iterator[bool]:
    """Holds an flock on `path`; yields False when LOCK_NB found it taken."""
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _extend(purelib: Path, version: str, log_line: Callable[[str], None]) -> tuple[str, ...]:
    """Puts the agent's site-packages after the environment's own (BASE_PTH); the directories, or none
    when the environment's Python is another version than the agent's (whose compiled packages, such as
    TensorFlow, it could not load)."""
    agent = ".".join(platform.python_version_tuple()[:2])
    if ".".join(version.split(".")[:2]) != agent:
        log_line(
            f"the environment's Python {version} is not the agent's {agent}: it holds the lock alone, "
            "without the agent's TensorFlow (pin tensorflow in the requirements)"
        )
        return ()
    directories, _ = runtime_base()
    (purelib / BASE_PTH).write_text("".join(f"{directory}\n" for directory in directories))
    return directories
