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
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import selectors
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("mwms.agent.environments")

KEY_FORMAT = "mwms-environment-2"
COMPLETE = ".mwms-complete"
# In site-packages of an environment that extends the agent's runtime: the agent's site-packages, one per
# line, which Python's site module appends after the environment's own (their .pth files are not run).
BASE_PTH = "_mwms_agent_runtime.pth"
LAST_USED = ".mwms-last-used"
MAX_LINE_CHARS = 2000
MAX_LINES = 2000
MAX_ERROR_CHARS = 1500
# The modules of mwms that mwms_runtime imports (task_environment imports preflight_contract): stdlib only.
SHARED_MODULES = ("task_environment.py", "metrics_line.py", "preflight_contract.py")
SHARED_INIT = (
    b'"""The runtime\'s share of mwms: the modules mwms_runtime imports, copied in by the agent."""\n'
)
# uv's words for a network failure (worth another try), then for the job's own mistake (not).
NETWORK_ERRORS = re.compile(
    "failed to fetch|error sending request|dns error|connection refused|timed out|tcp connect error|"
    "could not connect"
)
JOB_ERRORS = re.compile(
    "no solution found|not found in the package registry|because |failed to build|was not found|"
    "no matching distribution|couldn't parse requirement|invalid requirement"
)
PURELIB_QUERY = (
    "import sys, sysconfig; print(sysconfig.get_paths()['purelib']); print(sys.version.split()[0])"
)
# uv's words when a package has no wheel for this platform and building it from source is off.
SOURCE_BUILD_OFF = re.compile(
    "building source distributions is disabled|building from source is disabled|no-build"
)
SOURCE_BUILD_HINT = (
    " (the agent installs wheels only: building a source distribution would run the package's code as the "
    "agent; pin a version with a wheel for this platform, or ask the operator for --env-source-builds)"
)
# uv's lines that say what went well, left out of an error's message.
PROGRESS = ("Using ", "Resolved ", "Prepared ", "Installed ", "Downloading ", "Downloaded ", "Creating ")


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


class EnvironmentBuildError(Exception):
    """The job's environment could not be built; `retryable` says whether another try may succeed."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


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


class _Output:
    """uv's lines: forwarded to the task's log (bounded) and the last ones kept for an error message."""

    def __init__(self, log_line: Callable[[str], None]) -> None:
        self._log = log_line
        self.forwarded = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=60)

    def add(self, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip()
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + " … (line cut)"
        self.tail.append(line)
        if self.forwarded < MAX_LINES:
            self._log(line)
        elif self.forwarded == MAX_LINES:
            self._log(f"(uv's further output is not shown: over {MAX_LINES} lines)")
        self.forwarded += 1


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
                self._uv_run(venv, spec.python, out, deadline, private)
                purelib, version = self._python(python, PURELIB_QUERY, deadline, private).split("\n")[:2]
                sync = ["pip", "sync", "--python", str(python), "requirements.txt"]
                if not self._source_builds:
                    sync.insert(2, "--no-build")  # uv's UV_NO_BUILD does not reach `pip sync`
                self._uv_run(sync, "", out, deadline, private)
                _overlay(Path(purelib), log_line)
                extends = () if spec.isolated else _extend(Path(purelib), version, log_line)
                self._compile(Path(purelib), version, deadline, log_line)
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

    def _uv_run(self, args: list[str], python: str, out: _Output, deadline: float, cwd: str) -> None:
        """Runs uv, its lines to `out`; EnvironmentBuildError, classified by its output, if it fails
        (`python`: the Python the job asked for, when the step is the one that finds it)."""
        env = {**os.environ, "UV_NO_PROGRESS": "1", "NO_COLOR": "1"}
        # Nothing of the job's runs as the agent: uv compiles no bytecode (that runs the environment's
        # Python, and so its packages' .pth files; _compile does it safely) and builds no source
        # distribution (its build script is the package's code) unless the operator allows it.
        env["UV_COMPILE_BYTECODE"] = "0"
        # Hard links into uv's cache where it is on the same filesystem (uv copies where it is not): TensorFlow
        # alone is 1.9 GB, copied in 19 s and stored once more per environment. Sealing then makes those
        # cache files read-only too, which uv never writes in place; an operator may still set copy.
        env.setdefault("UV_LINK_MODE", "hardlink")
        out.tail.clear()
        assert self._uv
        process = subprocess.Popen(
            [self._uv, *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed whole at the deadline
        )
        try:
            _pump(process, out, deadline)
            code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if process.returncode is None:
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if code is None:
            raise self._timeout_error()
        if code != 0:
            raise _classify(list(out.tail), python)

    def _compile(self, purelib: Path, version: str, deadline: float, log_line: Callable[[str], None]) -> None:
        """Byte-compiles site-packages (tasks cannot write bytecode into the sealed tree) with the agent's
        own interpreter, which compiles the files without running any of them: the environment's own
        Python would first run the packages' .pth files, the job's code, as the agent. Skipped for a
        Python of another version, whose tasks then compile what they import each time."""
        if tuple(version.split(".")[:2]) != platform.python_version_tuple()[:2]:
            log_line(f"bytecode not compiled ahead: the environment's Python {version} is not the agent's")
            return
        command = [sys.executable, "-I", "-m", "compileall", "-q", "-j", "0", str(purelib)]
        try:
            timeout = max(0.0, deadline - time.monotonic())
            subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise self._timeout_error() from None
        # A file that does not compile (a package's test data, say) is left to be compiled on import.

    def _python(self, python: Path, code: str, deadline: float, cwd: str, *args: str) -> str:
        """Runs `code` in the new environment, isolated (-I: no PYTHONPATH, no user site); its stdout.
        Only before any package is installed: afterwards their .pth files would run as the agent."""
        try:
            command, timeout = [str(python), "-I", "-c", code, *args], max(0.0, deadline - time.monotonic())
            done = subprocess.run(
                command, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise self._timeout_error() from None
        if done.returncode != 0:
            what = f"the environment's Python {python} does not run"
            raise EnvironmentBuildError(f"{what}: {done.stderr.strip()[-MAX_ERROR_CHARS:]}", retryable=False)
        return done.stdout

    def _timeout_error(self) -> EnvironmentBuildError:
        return EnvironmentBuildError(
            f"the job's Python environment took longer than {self._timeout:g} s to build; the agent's "
            "--env-build-timeout raises the limit",
            retryable=False,
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


def _pump(process: subprocess.Popen[bytes], out: _Output, deadline: float) -> None:
    """Hands `process`'s lines to `out` as they come, until it closes its output or the deadline passes."""
    assert process.stdout is not None
    fd, pending = process.stdout.fileno(), b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                out.add(line)
            if len(pending) > 4 * MAX_LINE_CHARS:
                out.add(pending)
                pending = b""
        else:
            raise subprocess.TimeoutExpired(process.args, 0)
    if pending:
        out.add(pending)


def _classify(lines: list[str], python: str) -> EnvironmentBuildError:
    """uv's failure as an error: the job's to fix (not retryable) or the network's (retryable)."""
    starts = [i for i, line in enumerate(lines) if line.lstrip(" ×").lower().startswith("error")]
    meaningful = [" ".join(line.split()) for line in lines[starts[-1] if starts else 0 :]]
    summary = " ".join(line for line in meaningful if line and not line.startswith(PROGRESS))
    summary = summary if len(summary) <= MAX_ERROR_CHARS else summary[:MAX_ERROR_CHARS] + " …"
    text = "\n".join(lines).lower()
    network = NETWORK_ERRORS.search(text) is not None
    if python and not network:
        return EnvironmentBuildError(
            f"the job asks for Python {python!r}, which uv cannot provide on this agent ({summary}); ask for "
            "a Python installed on the agents, or leave python out to use the agent's own",
            retryable=False,
        )
    job = not network and JOB_ERRORS.search(text) is not None
    hint = SOURCE_BUILD_HINT if not network and SOURCE_BUILD_OFF.search(text) else ""
    return EnvironmentBuildError(
        f"could not build the job's Python environment: {summary}{hint}", retryable=not job and not hint
    )


def _overlay(purelib: Path, log_line: Callable[[str], None]) -> None:
    """Writes mwms_runtime and the runtime's share of mwms into site-packages (over any the lock brought)."""
    for package in ("mwms_runtime", "mwms"):
        if (purelib / package).exists():
            log_line(f"the job's lock installs {package}; the agent's own replaces it")
            shutil.rmtree(purelib / package)
    for name, data in RUNTIME_FILES.items():
        (purelib / name).parent.mkdir(parents=True, exist_ok=True)
        (purelib / name).write_bytes(data)


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
