"""Following a job on a terminal: the status line is cleared before the program's output is printed, and
Ctrl-C says what happens to the job (a waiting one stays queued) and how to cancel it."""

from __future__ import annotations

import io
import os
import select
import sys
from collections.abc import Iterator

import pytest

from mwms.cli import submit
from mwms.cli.output import CLEAR_LINE, clear_status_line
from mwms.cli.safe_text import SafeConsole
from mwms.cli.submit import TextFollower, stopped_following_message


@pytest.fixture
def terminal() -> Iterator[tuple[int, io.TextIOWrapper]]:
    """A pseudo-terminal: its master end to read what was written, its slave end as a text stream."""
    master, slave = os.openpty()
    stream = io.TextIOWrapper(os.fdopen(slave, "wb", buffering=0), encoding="utf-8", write_through=True)
    try:
        yield master, stream
    finally:
        stream.close()
        os.close(master)


def read_all(master: int) -> str:
    chunks = []
    while select.select([master], [], [], 0.2)[0]:
        chunks.append(os.read(master, 65536))
    return b"".join(chunks).decode("utf-8", "replace")


def test_the_status_line_is_cleared_on_a_terminal(terminal: tuple[int, io.TextIOWrapper]) -> None:
    master, stream = terminal
    assert clear_status_line(stream) is True
    assert read_all(master) == CLEAR_LINE


def test_nothing_is_written_to_a_pipe_or_file() -> None:
    stream = io.StringIO()
    assert clear_status_line(stream) is False
    assert stream.getvalue() == ""


def test_the_programs_output_starts_on_a_line_of_its_own(
    terminal: tuple[int, io.TextIOWrapper], monkeypatch: pytest.MonkeyPatch
) -> None:
    master, stream = terminal
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(sys, "stderr", stream)
    # The CLI's consoles, made as they are when the command starts on a terminal.
    monkeypatch.setattr(submit, "out", SafeConsole(highlight=False, soft_wrap=True))
    monkeypatch.setattr(submit, "err", SafeConsole(stderr=True, highlight=False, soft_wrap=True))
    with TextFollower(logs_to_stdout=True) as follower:
        follower.on_job({"id": "j1", "state": "RUNNING", "attempts": 1, "step": 30, "loss": 0.1448})
        follower.on_log_lines([{"task": 0, "text": "FINAL loss=0.1448 steps=30"}])
    shown = read_all(master)
    assert "FINAL loss=0.1448 steps=30" in shown
    before_output = shown[: shown.index("FINAL")]
    assert "loss 0.1448" in before_output  # the status line was drawn ...
    assert before_output.endswith(CLEAR_LINE)  # ... and taken off before the program's line


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (
            "PENDING",
            "stopped following; job j1 stays queued (PENDING): watch it with mwms logs j1 --follow, "
            "cancel it with mwms cancel j1",
        ),
        (
            None,
            "stopped following; job j1 stays queued (not yet placed): watch it with mwms logs j1 --follow, "
            "cancel it with mwms cancel j1",
        ),
        (
            "RUNNING",
            "stopped following; job j1 keeps running (RUNNING): watch it with mwms logs j1 --follow, "
            "cancel it with mwms cancel j1",
        ),
    ],
)
def test_ctrl_c_says_what_happens_to_the_job(state: str | None, expected: str) -> None:
    assert stopped_following_message("j1", state) == expected


def _followed(states: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """What `mwms submit --follow` prints to a pipe for these polled states of one job."""
    captured = io.StringIO()
    monkeypatch.setattr(submit, "err", SafeConsole(file=captured, highlight=False, soft_wrap=True))
    tasks = [
        {"index": 0, "attempt": 1, "address": "10.0.0.1:2222"},
        {"index": 0, "attempt": 2, "address": "10.0.0.1:2300"},
        {"index": 1, "attempt": 2, "address": "10.0.0.2:2300"},
    ]
    reasons = {"PENDING": "waiting for 2 free devices", "SCHEDULED": "attempt 2: 2 workers on 2 agents: …"}
    with TextFollower(logs_to_stdout=True) as follower:
        for state in states:
            follower.on_job({"id": "j1", "state": state, "reason": reasons.get(state, "ok"), "tasks": tasks})
    return captured.getvalue()


def test_a_job_seen_running_says_where_its_workers_run_even_when_scheduled_went_by(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Polled once a second, a job whose workers start warm may go PENDING -> SCHEDULED -> RUNNING unseen.
    printed = _followed(["PENDING", "RUNNING"], monkeypatch)
    assert printed.splitlines() == [
        "job j1 PENDING: waiting for 2 free devices",
        "job j1 RUNNING: 2 workers on 10.0.0.1:2300, 10.0.0.2:2300",  # the newest attempt's
    ]
    # SCHEDULED seen: its reason named the workers, and RUNNING does not repeat them.
    printed = _followed(["PENDING", "SCHEDULED", "RUNNING"], monkeypatch)
    assert printed.splitlines()[-1] == "job j1 RUNNING"
