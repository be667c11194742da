"""Running uv and the new environment's Python while a job's environment is built: their output (to the
task's log, bounded), the build's deadline, and what a failure means: the job's to fix (not retryable)
or the network's (retryable). worker_agent/environments.py builds with them."""

from __future__ import annotations

import collections
import contextlib
import os
import platform
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

MAX_LINE_CHARS = 2000
MAX_LINES = 2000
MAX_ERROR_CHARS = 1500
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


class EnvironmentBuildError(Exception):
    """The job's environment could not be built; `retryable` says whether another try may succeed."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


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


def uv_run(
    uv: str | None, args: list[str], python: str, out: _Output, deadline: float, cwd: str, timeout_s: float
) -> None:
    """Runs uv, its lines to `out`; EnvironmentBuildError, classified by its output, if it fails
    (`python`: the Python the job asked for, when the step is the one that finds it)."""
    env = {**os.environ, "UV_NO_PROGRESS": "1", "NO_COLOR": "1"}
    # Nothing of the job's runs as the agent: uv compiles no bytecode (that runs the environment's
    # Python, and so its packages' .pth files; compile_bytecode does it safely) and builds no source
    # distribution (its build script is the package's code) unless the operator allows it.
    env["UV_COMPILE_BYTECODE"] = "0"
    # Hard links into uv's cache where it is on the same filesystem (uv copies where it is not): TensorFlow
    # alone is 1.9 GB, copied in 19 s and stored once more per environment. Sealing then makes those
    # cache files read-only too, which uv never writes in place; an operator may still set copy.
    env.setdefault("UV_LINK_MODE", "hardlink")
    out.tail.clear()
    assert uv
    process = subprocess.Popen(
        [uv, *args],
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
        raise timeout_error(timeout_s)
    if code != 0:
        raise _classify(list(out.tail), python)


def compile_bytecode(
    purelib: Path, version: str, deadline: float, log_line: Callable[[str], None], timeout_s: float
) -> None:
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
        raise timeout_error(timeout_s) from None
    # A file that does not compile (a package's test data, say) is left to be compiled on import.


def run_python(python: Path, code: str, deadline: float, cwd: str, timeout_s: float, *args: str) -> str:
    """Runs `code` in the new environment, isolated (-I: no PYTHONPATH, no user site); its stdout.
    Only before any package is installed: afterwards their .pth files would run as the agent."""
    try:
        command, timeout = [str(python), "-I", "-c", code, *args], max(0.0, deadline - time.monotonic())
        done = subprocess.run(
            command, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise timeout_error(timeout_s) from None
    if done.returncode != 0:
        what = f"the environment's Python {python} does not run"
        raise EnvironmentBuildError(f"{what}: {done.stderr.strip()[-MAX_ERROR_CHARS:]}", retryable=False)
    return done.stdout


def timeout_error(timeout_s: float) -> EnvironmentBuildError:
    """The error of a build that took longer than `timeout_s` (the agent's --env-build-timeout)."""
    return EnvironmentBuildError(
        f"the job's Python environment took longer than {timeout_s:g} s to build; the agent's "
        "--env-build-timeout raises the limit",
        retryable=False,
    )


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
