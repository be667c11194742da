"""Starting and stopping the local coordinator and agent processes that `mwms quickstart` runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mwms import agent_defaults

# What an agent gives its tasks when it stops: the quickstart's processes get as long.
STOP_GRACE_S = agent_defaults.STOP_GRACE_S


def mwms_command() -> list[str]:
    """argv prefix that runs this same mwms, whatever PATH says."""
    return [sys.executable, "-m", "mwms.cli.main"]


@dataclass
class ManagedProcess:
    """A child process whose stdout and stderr go to `log_path`."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log_file: IO[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def close_log(self) -> None:
        self._log_file.close()


def start_process(
    name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> ManagedProcess:
    """Starts `argv` in its own session (so Ctrl-C reaches only us, and we stop children in order)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("ab")
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
        )
    except BaseException:
        log_file.close()
        raise
    return ManagedProcess(name=name, popen=popen, log_path=log_path, _log_file=log_file)


def stop_processes(processes: Sequence[ManagedProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to every process still running, SIGKILL to those alive after `grace_s`."""
    for process in processes:
        if process.running():
            process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait()
        process.close_log()


def last_lines(path: Path, count: int = 20) -> list[str]:
    """The last `count` lines of a text file (empty if it does not exist)."""
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - 64 * 1024))
            data = file.read()
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-count:]
