"""One task's child process: spawned in its own process group, its output read line by line, its exit seen.

The runner knows nothing about the protocol: it calls `on_output(stream, text)` for every line and
`on_exit(exit_code)` once, from its own threads.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mwms.worker_agent.stacks import group_members

log = logging.getLogger("mwms.agent.runner")

# A line longer than this is delivered in pieces, so a program printing without newlines cannot exhaust memory.
MAX_LINE_BYTES = 64 * 1024
# After the process exits, readers get this long to drain what is left in the pipes.
READER_DRAIN_SECONDS = 5.0


def shell_exit_code(returncode: int) -> int:
    """A Popen returncode as a shell reports it: a death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(exit_code: int) -> str:
    """ "exited with code N", naming the signal when N is 128 + a signal number."""
    text = f"exited with code {exit_code}"
    if exit_code > 128:
        try:
            text += f" ({signal.Signals(exit_code - 128).name})"
        except ValueError:
            pass
    return text


class TaskProcess:
    """A child process in its own session whose stdout/stderr lines and exit code are reported by callback."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: Path,
        on_output: Callable[[str, str], None],
        on_exit: Callable[[int], None],
        *,
        user: int | None = None,
        group: int | None = None,
        spare_leader: bool = False,
    ) -> None:
        self._user = user
        self._group = group
        # SIGTERM to the group but not its leader (a sandbox's monitor, worker_agent/sandbox.py).
        self._spare_leader = spare_leader
        self._command = command
        self._env = env
        self._cwd = cwd
        self._on_output = on_output
        self._on_exit = on_exit
        self._popen: subprocess.Popen[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self.exited = threading.Event()
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        assert self._popen is not None, "the process has not been started"
        return self._popen.pid

    def start(self) -> int:
        """Spawns the process (OSError when it cannot be) and returns its pid."""
        self._popen = subprocess.Popen(
            self._command,
            cwd=self._cwd,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            # Another user (an agent running as root): its uid and gid, no supplementary groups, and
            # files it creates closed to others.
            user=self._user,
            group=self._group,
            extra_groups=[] if self._user is not None else None,
            umask=0o077 if self._user is not None else -1,
        )
        for stream, pipe in (("stdout", self._popen.stdout), ("stderr", self._popen.stderr)):
            assert pipe is not None
            reader = threading.Thread(
                target=self._read_lines, args=(stream, pipe), name=f"task-{self.pid}-{stream}", daemon=True
            )
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._wait, name=f"task-{self.pid}-waiter", daemon=True).start()
        return self._popen.pid

    def terminate(self, grace_seconds: float) -> None:
        """SIGTERM to the process group, SIGKILL to it when the process outlives `grace_seconds`."""
        if self._popen is None or self.exited.is_set():
            return
        if self._spare_leader:
            self._signal_members(signal.SIGTERM)
        else:
            self._signal_group(signal.SIGTERM)
        if not self.exited.wait(max(0.0, grace_seconds)):
            log.info("task process %d ignored SIGTERM for %.0f s; killing it", self.pid, grace_seconds)
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: signal.Signals) -> None:
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _signal_members(self, signum: signal.Signals) -> None:
        for member in group_members(self.pid):
            if member != self.pid:
                try:
                    os.kill(member, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    def _read_lines(self, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
                text = raw.decode("utf-8", errors="replace")
                if text.endswith("\n"):
                    text = text[:-1]
                    if text.endswith("\r"):
                        text = text[:-1]
                self._on_output(stream, text)

    def _wait(self) -> None:
        assert self._popen is not None
        returncode = self._popen.wait()
        self.exit_code = shell_exit_code(returncode)
        self.exited.set()
        # Whatever the task left running in its group (and holding its pipes) ends with it.
        self._signal_group(signal.SIGKILL)
        for reader in self._readers:
            reader.join(READER_DRAIN_SECONDS)
        self._on_exit(self.exit_code)
