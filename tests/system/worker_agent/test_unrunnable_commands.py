"""A command that cannot be executed: the agent reports FAILED with a shell's exit code, no pid and why,
so the coordinator fails the job at once. check_runnable decides as execvp would; the agent runs against
a fake coordinator on a real gRPC server."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from mwms.task_environment import COMMAND_NOT_EXECUTABLE_EXIT_CODE, COMMAND_NOT_FOUND_EXIT_CODE
from mwms.v1 import agent_pb2
from mwms.worker_agent.runner import CommandNotRunnable, check_runnable, spawn_refusal
from mwms_testkit.agent_builders import connected, start_task
from mwms_testkit.cluster import pack


def refusal(program: str, cwd: Path, path: str | None = "/usr/bin:/bin") -> CommandNotRunnable:
    with pytest.raises(CommandNotRunnable) as caught:
        check_runnable(program, program, path, cwd)
    return caught.value


def test_check_runnable_decides_as_execvp(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "sub").mkdir()
    check_runnable("sh", "sh", "/usr/bin:/bin", tmp_path)  # on PATH
    one_string = refusal("python train.py --epochs 1", tmp_path)
    assert one_string.exit_code == COMMAND_NOT_FOUND_EXIT_CODE
    assert str(one_string) == (
        "'python train.py --epochs 1' was not found on the agent's PATH; the command was given as one "
        "string: pass its words separately (python train.py --epochs 1)"
    )
    bare = refusal("train.py", tmp_path)
    assert str(bare).endswith("to run the bundle's train.py, write python train.py (or ./train.py)")
    missing = refusal("./missing.sh", tmp_path)
    assert (str(missing), missing.exit_code) == (
        "'./missing.sh' does not exist in the job's bundle",
        COMMAND_NOT_FOUND_EXIT_CODE,
    )
    not_executable = refusal("./run.sh", tmp_path)
    assert not_executable.exit_code == COMMAND_NOT_EXECUTABLE_EXIT_CODE
    assert "is not executable: run it with its interpreter" in str(not_executable)
    assert refusal("./sub", tmp_path).exit_code == COMMAND_NOT_EXECUTABLE_EXIT_CODE
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    check_runnable("./run.sh", "./run.sh", "/usr/bin:/bin", tmp_path)


def test_a_spawn_error_of_the_command_itself_is_not_retryable() -> None:
    gone = FileNotFoundError(2, "No such file or directory", "nope")
    assert spawn_refusal(gone, "nope", "nope").exit_code == COMMAND_NOT_FOUND_EXIT_CODE  # type: ignore[union-attr]
    format_error = OSError(8, "Exec format error", "/b/x")
    assert spawn_refusal(format_error, "/b/x", "x").exit_code == COMMAND_NOT_EXECUTABLE_EXIT_CODE  # type: ignore[union-attr]
    # A missing working directory is the machine's trouble: another try may work.
    assert (
        spawn_refusal(FileNotFoundError(2, "No such file or directory", "/w/bundle"), "nope", "nope") is None
    )


def test_the_agent_reports_a_command_it_cannot_execute_as_never_started(  # type: ignore[no-untyped-def]
    coordinator, start_agent, wait_for
) -> None:
    fake, address = coordinator
    start_agent(address)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": "print('hi')"}))
    stream.send(start=start_task("task-quoted", digest, command=["python train.py --epochs 1"]))
    wait_for(
        lambda: agent_pb2.TASK_STATE_FAILED in fake.states("task-quoted"),
        "FAILED",
        observed=lambda: fake.reports("task-quoted"),
    )
    final = fake.reports("task-quoted")[-1]
    assert (final.exit_code, final.pid) == (COMMAND_NOT_FOUND_EXIT_CODE, 0)
    assert final.message.startswith("never started: 'python train.py --epochs 1' was not found")
    assert "pass its words separately (python train.py --epochs 1)" in final.message
    assert fake.states("task-quoted") == [agent_pb2.TASK_STATE_STARTING, agent_pb2.TASK_STATE_FAILED]
