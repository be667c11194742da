"""The agent takes several snapshots of a real task process's stacks, spaced apart and bounded, as one text."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms import stack_dumps
from mwms.server.services.observing.stack_text import read_dump
from mwms.worker_agent import stacks

# The main thread alternates between two named functions, as a training loop does between steps.
ALTERNATING = textwrap.dedent(
    """
    import sys, time
    def inside_the_step():
        time.sleep(0.05)
    def between_steps():
        time.sleep(0.05)
    print("ready", flush=True)
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline:
        inside_the_step()
        between_steps()
    """
)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen] = []

    def start(seconds: float) -> subprocess.Popen:
        (tmp_path / "loop.py").write_text(ALTERNATING)
        directory = tmp_path / "stacks"
        directory.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(stacks.handler_environment(env, directory))
        process = subprocess.Popen(
            [sys.executable, "loop.py", str(seconds)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_three_snapshots_half_a_second_apart_in_one_text(tmp_path: Path, spawn) -> None:
    process = spawn(60)
    started = time.monotonic()
    taken = stacks.take_snapshots(process.pid, tmp_path / "stacks", "faulthandler")
    took = time.monotonic() - started
    assert taken.error == "" and taken.method == "faulthandler" and taken.pid == process.pid
    parts = stack_dumps.split_snapshots(taken.text)
    assert len(parts) == stack_dumps.SNAPSHOTS == 3
    assert all("loop.py" in part for part in parts), taken.text
    assert "=== mwms snapshot 3 of 3 at +1.0" in taken.text  # spaced by SNAPSHOT_SPACING_S
    assert 0.9 < took < 5, took
    assert read_dump(taken.text).snapshots == 3
    assert len(taken.text.encode()) <= stack_dumps.MAX_STACK_BYTES


def test_count_and_spacing_are_bounded(tmp_path: Path, spawn) -> None:
    process = spawn(60)
    one = stacks.take_snapshots(process.pid, tmp_path / "stacks", "faulthandler", count=0, spacing_s=-3)
    assert len(stack_dumps.split_snapshots(one.text)) == 1
    started = time.monotonic()
    many = stacks.take_snapshots(process.pid, tmp_path / "stacks", "faulthandler", count=50, spacing_s=0)
    assert len(stack_dumps.split_snapshots(many.text)) == stack_dumps.MAX_SNAPSHOTS
    assert time.monotonic() - started < 10


def test_a_process_that_ends_between_snapshots_keeps_those_taken(tmp_path: Path, spawn) -> None:
    process = spawn(0.6)
    taken = stacks.take_snapshots(process.pid, tmp_path / "stacks", "faulthandler", count=3, spacing_s=1.0)
    assert len(stack_dumps.split_snapshots(taken.text)) == 1
    assert taken.error.startswith("took 1 of 3 snapshots: "), taken.error
