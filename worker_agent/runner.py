"""One task's child process: spawned in its own process group, its output read line by line, its exit seen.

The runner knows nothing about the protocol: it calls `on_output(stream, text, redraw)` for every line
(`redraw`: a newer state of the line before it from that stream, worker_agent/output_lines.py) and
`on_exit(exit_code)` once, from its own threads.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mwms.task_environment import COMMAND_NOT_EXECUTABLE_EXIT_CODE, COMMAND_NOT_FOUND_EXIT_CODE
from mwms.worker_agent import seccomp
from mwms.worker_agent.output_lines import read_output
from mwms.worker_agent.stacks import group_members

log = logging.getLogger("mwms.agent.runner")

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


class CommandNotRunnable(Exception):
    """The task's command cannot be executed (not found, not executable): the job's fault, so the task
    never starts and no retry can help. `exit_code` is a shell's code for the same (127 or 126)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _one_string_hint(program: str) -> str:
    """For a command given as one string ("python train.py --epochs 1"): its words, to pass separately."""
    try:
        words = shlex.split(program)
    except ValueError:
        return ""
    if len(words) < 2:
        return ""
    return f"; the command was given as one string: pass its words separately ({shlex.join(words)})"


def check_runnable(program: str, shown: str, path: str | None, cwd: Path) -> None:
    """Raises CommandNotRunnable when `program` (the command's first word as it will be executed; `shown`:
    as the job gave it) would not execute from `cwd` with the search path `path`, as execvp decides.

    Checked before spawning because a confined task is spawned by bubblewrap, which reports a failed
    exec only as its own exit code 1."""
    if "/" in program:
        target = Path(program) if os.path.isabs(program) else cwd / program
        where = "" if os.path.isabs(program) else " in the job's bundle"
        if not target.exists():
            raise CommandNotRunnable(
                f"{shown!r} does not exist{where}{_one_string_hint(shown)}", COMMAND_NOT_FOUND_EXIT_CODE
            )
        if target.is_dir():
            raise CommandNotRunnable(
                f"{shown!r} is a directory, not a program", COMMAND_NOT_EXECUTABLE_EXIT_CODE
            )
        if not os.access(target, os.X_OK):
            raise CommandNotRunnable(
                f"{shown!r} is not executable: run it with its interpreter (e.g. python {shown}) or make it "
                "executable (chmod +x) before submitting",
                COMMAND_NOT_EXECUTABLE_EXIT_CODE,
            )
        return
    if shutil.which(program, path=path if path is not None else os.defpath) is not None:
        return
    hint = _one_string_hint(shown)
    if not hint and (cwd / program).is_file():
        hint = f"; to run the bundle's {program}, write python {program} (or ./{program})"
    raise CommandNotRunnable(
        f"{shown!r} was not found on the agent's PATH{hint}", COMMAND_NOT_FOUND_EXIT_CODE
    )


def spawn_refusal(error: OSError, program: str, shown: str) -> CommandNotRunnable | None:
    """What an OSError of spawning `program` means when the command itself cannot be executed, else None
    (a missing working directory, too many processes: the machine's trouble, worth another try)."""
    if error.filename is None or str(error.filename) != program:
        return None  # subprocess names the program it could not execute (a failed chdir names the dir)
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        return CommandNotRunnable(
            f"{shown!r} was not found ({error.strerror}){_one_string_hint(shown)}",
            COMMAND_NOT_FOUND_EXIT_CODE,
        )
    if error.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR, errno.EPERM):
        return CommandNotRunnable(
            f"{shown!r} cannot be executed ({error.strerror}): a script needs a #! line and chmod +x, or "
            f"run it with its interpreter (e.g. python {shown})",
            COMMAND_NOT_EXECUTABLE_EXIT_CODE,
        )
    return None


class TaskProcess:
    """A child process in its own session whose stdout/stderr lines and exit code are reported by callback."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: Path,
        on_output: Callable[[str, str, bool], None],
        on_exit: Callable[[int], None],
        *,
        user: int | None = None,
        group: int | None = None,
        spare_leader: bool = False,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self._user = user
        # Descriptors it inherits besides its sandbox's seccomp filter (a warm interpreter's channel).
        self._pass_fds = pass_fds
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
        with seccomp.filled_argv(self._command) as (argv, fds):
            self._popen = self._spawn(argv, fds)
        for stream, pipe in (("stdout", self._popen.stdout), ("stderr", self._popen.stderr)):
            assert pipe is not None
            reader = threading.Thread(
                target=self._read_lines, args=(stream, pipe), name=f"task-{self.pid}-{stream}", daemon=True
            )
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._wait, name=f"task-{self.pid}-waiter", daemon=True).start()
        return self._popen.pid

    def _spawn(self, argv: list[str], fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
        """`argv` in a session of its own; `fds`: descriptors it inherits (its sandbox's seccomp filter)."""
        return subprocess.Popen(
            argv,
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
            pass_fds=(*fds, *self._pass_fds),
        )

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
        # Lines, and `\r` redraws as newer states of a line (worker_agent/output_lines.py).
        with pipe:
            read_output(pipe.fileno(), lambda text, redraw: self._on_output(stream, text, redraw))

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
