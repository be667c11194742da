"""Taking a real task process's stacks: the faulthandler handler from the agent's sitecustomize, py-spy."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms.v1 import agent_pb2
from mwms.worker_agent import stacks

# A program that knows nothing of mwms: a second thread, then the main thread sleeps in a named function.
SLEEPER = textwrap.dedent(
    """
    import threading, time
    started = threading.Event()
    def background_worker():
        started.set()
        time.sleep(120)
    def wait_before_first_allreduce():
        started.wait()
        print("ready", flush=True)
        time.sleep(120)
    threading.Thread(target=background_worker, name="bg", daemon=True).start()
    wait_before_first_allreduce()
    """
)


def spawn(tmp_path: Path, command: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    directory = tmp_path / "stacks"
    directory.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (extra_env or {})
    env.update(stacks.handler_environment(env, directory))
    process = subprocess.Popen(
        command,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", process.stderr.read() if process.stderr else ""
    return process


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the whole group: a shell's python child too
        except ProcessLookupError:
            pass
        process.wait()


def test_the_handler_dumps_every_thread_innermost_first_and_the_program_keeps_running(
    tmp_path: Path, processes: list[subprocess.Popen]
) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    process = spawn(tmp_path, [sys.executable, "sleeper.py"])
    processes.append(process)

    taken = stacks.take_stacks(process.pid, tmp_path / "stacks", method="faulthandler")
    assert taken.error == "" and taken.method == "faulthandler" and taken.pid == process.pid
    main = taken.text.split("Current thread")[1]
    frames = [line.strip() for line in main.splitlines()[1:] if line.strip()]
    assert "wait_before_first_allreduce" in frames[0], taken.text  # innermost first
    assert "in background_worker" in taken.text
    # A second dump reads only what the second signal wrote, and the process is still alive.
    again = stacks.take_stacks(process.pid, tmp_path / "stacks", method="faulthandler")
    assert again.text.count("Current thread") == 1, again.text
    assert process.poll() is None


def test_a_users_own_sitecustomize_still_runs(tmp_path: Path, processes: list[subprocess.Popen]) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    (tmp_path / "check.py").write_text(
        "import builtins, time\nassert builtins.USER_SITE_RAN\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    process = spawn(tmp_path, [sys.executable, "check.py"], {"PYTHONPATH": str(own)})
    processes.append(process)
    assert stacks.take_stacks(process.pid, tmp_path / "stacks", method="faulthandler").error == ""


def test_python_under_a_shell_is_found_through_its_handler(
    tmp_path: Path, processes: list[subprocess.Popen]
) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    process = spawn(tmp_path, ["/bin/sh", "-c", f"{sys.executable} sleeper.py; echo done"])
    processes.append(process)
    taken = stacks.take_stacks(process.pid, tmp_path / "stacks", method="faulthandler")
    assert taken.error == "" and taken.pid != process.pid, taken
    assert "wait_before_first_allreduce" in taken.text
    assert process.poll() is None  # the shell was never signalled


def test_a_process_without_the_handler_is_an_error_not_a_signal(
    tmp_path: Path, processes: list[subprocess.Popen]
) -> None:
    process = subprocess.Popen(
        ["/bin/sh", "-c", "echo ready; sleep 60"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    processes.append(process)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    (tmp_path / "stacks").mkdir()
    taken = stacks.take_stacks(process.pid, tmp_path / "stacks", method="faulthandler")
    assert "no stack handler" in taken.error and taken.text == ""
    assert process.poll() is None


def test_py_spy_dumps_the_same_process(tmp_path: Path, processes: list[subprocess.Popen]) -> None:
    executable = stacks.py_spy_executable()
    if executable is None:
        pytest.skip("py-spy is not installed (pip install py-spy)")
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    process = spawn(tmp_path, [sys.executable, "sleeper.py"])
    processes.append(process)
    taken = stacks.dump_with_py_spy(process.pid, executable)
    if "ermission" in taken.error or "ptrace" in taken.error.lower():
        pytest.skip(f"py-spy may not trace here: {taken.error}")
    assert taken.error == "", taken.error
    main = taken.text.split('"MainThread"')[1].splitlines()
    assert main[1].strip().startswith("wait_before_first_allreduce (sleeper.py:"), taken.text
    assert "background_worker (sleeper.py:" in taken.text
    assert stacks.take_stacks(process.pid, tmp_path / "stacks", method="auto").method == "py-spy"


def test_answers_come_for_every_task_named_at_once(tmp_path: Path, processes: list[subprocess.Popen]) -> None:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    process = spawn(tmp_path, [sys.executable, "sleeper.py"])
    processes.append(process)
    targets = [
        stacks.DumpTarget("t-live", process.pid, tmp_path / "stacks"),
        stacks.DumpTarget("t-gone", unavailable="task t-gone is not known to this agent"),
    ]
    answers: queue.Queue[agent_pb2.AgentMessage] = queue.Queue()
    started = time.monotonic()
    stacks.answer_dump_stacks(
        agent_pb2.DumpStacks(request_id="r-1", task_ids=["t-live", "t-gone"]),
        targets,
        answers.put,
        method="faulthandler",
    )
    assert time.monotonic() - started < 0.5  # the caller (the stream thread) never waits for a dump
    got = {m.stacks.task_id: m.stacks for m in (answers.get(timeout=10), answers.get(timeout=10))}
    assert got["t-live"].request_id == "r-1" and "wait_before_first_allreduce" in got["t-live"].text
    assert got["t-live"].pid == process.pid and got["t-live"].method == "faulthandler"
    assert got["t-gone"].error == "task t-gone is not known to this agent" and got["t-gone"].text == ""


def test_a_dump_is_bounded() -> None:
    text = "x" * (stacks.MAX_STACK_BYTES * 2)
    cut = stacks.bounded(text)
    assert len(cut.encode()) <= stacks.MAX_STACK_BYTES and cut.endswith("by the agent)\n")
    assert stacks.bounded("short") == "short"


def test_the_method_comes_from_the_agents_environment() -> None:
    assert stacks.preferred_method({}) == "auto"
    assert stacks.preferred_method({stacks.METHOD_ENV: "faulthandler"}) == "faulthandler"
    assert stacks.preferred_method({stacks.METHOD_ENV: "gdb"}) == "auto"
