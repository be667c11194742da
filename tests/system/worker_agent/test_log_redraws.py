"""A task's output cut into lines with `\\r` redraws as newer states of a line (worker_agent/output_lines.py),
read from a real pipe and a real child process, and numbered by the task's record (LogLine.replaces_seq)."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent.output_lines import MAX_LINE_BYTES, OutputLines, read_output
from mwms.worker_agent.runner import TaskProcess
from mwms.worker_agent.task_env import TaskPaths, resolve_command
from mwms.worker_agent.task_record import TaskRecord


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cut(*chunks: bytes, clock: Clock | None = None, step: float = 0.0) -> list[tuple[str, bool]]:
    """What OutputLines emits for `chunks` fed one after the other, the clock moving `step` between them."""
    emitted: list[tuple[str, bool]] = []
    clock = clock or Clock()
    lines = OutputLines(lambda text, redraw: emitted.append((text, redraw)), clock=clock)
    for chunk in chunks:
        lines.feed(chunk)
        clock.now += step
    lines.close()
    return emitted


def test_plain_lines_are_cut_as_before() -> None:
    assert cut(b"one\ntwo\r\n\nthree") == [("one", False), ("two", False), ("", False), ("three", False)]
    assert cut(b"caf", b"\xc3", b"\xa9\n") == [("café", False)]
    assert cut(b"") == []
    assert cut(b"\n") == [("", False)]


def test_redraws_ended_in_one_read_are_one_line_of_its_final_state() -> None:
    assert cut(b"  0%\r 50%\r100%\n") == [("100%", False)]
    # tqdm: a `\r` before each state; Keras: backspaces and `\r` before each state.
    assert cut(b"\r  0%|\r 50%|\r100%|\n") == [("100%|", False)]
    assert cut(b"1/2 [=>.]\x08\x08\x08\x08\x08\x08\x08\x08\x08\r2/2 [==] - loss: 0.5\n") == [
        ("2/2 [==] - loss: 0.5", False)
    ]
    # A state followed by `\r` and nothing else on its line: the state stands.
    assert cut(b"done\r\r\n") == [("done", False)]


def test_a_redrawn_line_is_sent_at_most_once_a_second_and_its_final_state_replaces_it() -> None:
    clock = Clock()
    emitted: list[tuple[str, bool]] = []
    lines = OutputLines(lambda text, redraw: emitted.append((text, redraw)), clock=clock)
    lines.feed(b"Epoch 1/2\n")
    lines.feed(b"\r 1/10")  # the first state goes out at once
    clock.now += 0.4
    lines.feed(b"\r 2/10")
    clock.now += 0.4
    lines.feed(b"\r 3/10")
    assert emitted == [("Epoch 1/2", False), (" 1/10", False)]
    assert lines.seconds_until_due() is not None and 0 < lines.seconds_until_due() <= 0.2 + 1e-9  # type: ignore[operator]
    clock.now += 0.3
    lines.send_due()  # what the reader does when the program printed nothing more meanwhile
    assert emitted[-1] == (" 3/10", True)
    assert lines.seconds_until_due() is None
    lines.feed(b"\r10/10 - loss: 0.1\nEpoch 2/2\n")
    assert emitted[-2:] == [("10/10 - loss: 0.1", True), ("Epoch 2/2", False)]


def test_a_final_state_already_sent_is_not_sent_again() -> None:
    assert cut(b"\r50%", b"\n") == [("50%", False)]
    # A `\r\n` split between two reads is a plain line end.
    assert cut(b"abc\r", b"\ndef\n") == [("abc", False), ("def", False)]
    clock = Clock()
    assert cut(b"a\r", b"b\r", b"\n", clock=clock, step=2.0) == [("a", False), ("b", True)]


def test_ten_thousand_redraws_a_second_cost_a_line_a_second() -> None:
    clock = Clock()
    emitted: list[tuple[str, bool]] = []
    lines = OutputLines(lambda text, redraw: emitted.append((text, redraw)), clock=clock)
    for read in range(300):  # 30,000 redraws in 100-redraw reads over 3 s
        lines.feed(b"".join(b"\r%5d/30000 [====>....]" % (read * 100 + i) for i in range(100)))
        clock.now += 0.01
    lines.feed(b"\n")
    assert 3 <= len(emitted) <= 5, emitted
    assert emitted[0] == ("   99/30000 [====>....]", False)
    assert all(redraw for _, redraw in emitted[1:])
    assert emitted[-1] == ("29999/30000 [====>....]", True)


def keras_epoch(steps: int) -> bytes:
    """An epoch of tf-keras' progress bar as it writes it to a pipe (verbose=1, tf_keras 2.x): each state is
    backspaces over the previous one, `\r`, then the bar, padded to one width."""
    data, width = b"Epoch 1/1\n", 0
    for step in range(1, steps + 1):
        done = 30 * step // steps
        bar = b"%3d/%d [%s>%s] - ETA: 1s - loss: 0.%04d" % (
            step,
            steps,
            b"=" * done,
            b"." * (29 - done),
            step,
        )
        data += b"\b" * width + b"\r" + bar
        width = len(bar)
    return data + b"\b" * width + b"\r%d/%d [%s] - 2s 20ms/step - loss: 0.0001\n" % (steps, steps, b"=" * 30)


def test_keras_states_cut_anywhere_by_the_pipe_are_sent_whole() -> None:
    bar = re.compile(r" *\d+/100 \[=*>\.*\] - ETA: 1s - loss: 0\.\d{4}")
    data = keras_epoch(100)
    for size in (7, 37, 200, 1000, len(data)):
        clock = Clock()
        emitted = cut(*(data[i : i + size] for i in range(0, len(data), size)), clock=clock, step=0.05)
        assert emitted[0] == ("Epoch 1/1", False)
        assert emitted[-1][0] == "100/100 [" + "=" * 30 + "] - 2s 20ms/step - loss: 0.0001"
        # The first state of a line may be cut (nothing came before it to stand instead); no later one is.
        states = [text for text, _ in emitted[2:-1]]
        assert all(bar.fullmatch(text) for text in states), (size, states)
        assert len(emitted) <= 2 + len(data) / size * 0.05 + 1


def test_a_line_longer_than_the_limit_comes_in_pieces_and_buffers_stay_bounded() -> None:
    emitted = cut(b"x" * (MAX_LINE_BYTES * 2 + 5) + b"\n")
    assert [len(text) for text, _ in emitted] == [MAX_LINE_BYTES, MAX_LINE_BYTES, 5]
    # Endless redraws of a huge line without a newline keep no more than a line's worth.
    lines = OutputLines(lambda text, redraw: None)
    for _ in range(50):
        lines.feed(b"\r" + b"y" * (MAX_LINE_BYTES - 1))
    assert len(lines._tail) < MAX_LINE_BYTES
    assert lines._drawn is not None and len(lines._drawn) <= MAX_LINE_BYTES


def test_escape_sequences_pass_through_for_the_readers_to_make_safe() -> None:
    assert cut(b"\x1b[32mok\x1b[0m\tdone\n") == [("\x1b[32mok\x1b[0m\tdone", False)]


def test_a_pipe_that_goes_quiet_still_delivers_the_newest_state_on_time() -> None:
    read_end, write_end = os.pipe()
    emitted: list[tuple[float, str, bool]] = []
    started = time.monotonic()

    def emit(text: str, redraw: bool) -> None:
        emitted.append((time.monotonic() - started, text, redraw))

    reader = threading.Thread(target=read_output, args=(read_end, emit), kwargs={"redraw_interval_s": 0.3})
    reader.start()
    try:
        os.write(write_end, b"\rstep 1")
        time.sleep(0.05)
        os.write(write_end, b"\rstep 2")  # within the interval: held back, then sent without more output
        deadline = time.monotonic() + 5
        while len(emitted) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [(text, redraw) for _, text, redraw in emitted] == [("step 1", False), ("step 2", True)]
        assert 0.25 <= emitted[1][0] < 2.0, emitted
        os.write(write_end, b"\rstep 3\n")
    finally:
        os.close(write_end)
        reader.join(5)
        os.close(read_end)
    assert not reader.is_alive()
    assert emitted[-1][1:] == ("step 3", True)


def test_a_child_process_redraw_reaches_on_output_with_its_mark(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "print('start', flush=True)\n"
        "for i in range(1, 4):\n"
        "    sys.stdout.write(f'\\r{i}/3'); sys.stdout.flush(); time.sleep(0.6)\n"
        "sys.stdout.write('\\r3/3 done\\n'); sys.stdout.flush()\n"
        "print('\\rerr 1\\rerr 2', file=sys.stderr)\n"
    )
    seen: list[tuple[str, str, bool]] = []
    exited = threading.Event()
    process = TaskProcess(
        resolve_command([sys.executable, "-c", code]),
        {},
        tmp_path,
        lambda stream, text, redraw: seen.append((stream, text, redraw)),
        lambda code: exited.set(),
    )
    process.start()
    assert exited.wait(20), seen
    stdout = [(text, redraw) for stream, text, redraw in seen if stream == "stdout"]
    assert stdout[0] == ("start", False)
    assert stdout[1] == ("1/3", False)
    assert ("2/3", True) in stdout[2:] or ("3/3", True) in stdout[2:], stdout
    assert stdout[-1] == ("3/3 done", True)
    assert [(text, redraw) for stream, text, redraw in seen if stream == "stderr"] == [("err 2", False)]


def test_the_record_numbers_a_redraw_as_replacing_the_line_before_it_of_its_stream(tmp_path: Path) -> None:
    start = agent_pb2.StartTask(task_id="t-redraw", job_id="j", attempt=1, task_index=0, num_workers=1)
    record = TaskRecord(start, TaskPaths.for_task(tmp_path, start), tmp_path / "outbox")
    record.add_log("stdout", "Epoch 1/1", False)
    record.add_log("stdout", "1/10", False)
    record.add_log("stderr", "a warning", False)  # another stream between two states: no matter
    record.add_log("stdout", "5/10", True)
    record.add_log("stdout", "mwms-agent: a note")  # an agent's note
    record.add_log("stdout", "10/10", True)  # after a note: a line of its own, the note stays
    lines = record.logs.unacked()
    record.logs.close()
    # The marks survive an agent restart in the on-disk outbox, for the resend.
    reopened = TaskRecord(start, TaskPaths.for_task(tmp_path, start), tmp_path / "outbox")
    assert reopened.logs.unacked() == lines
    reopened.logs.close()
    assert [(line.seq, line.text, line.replaces_seq) for line in lines] == [
        (1, "Epoch 1/1", 0),
        (2, "1/10", 0),
        (3, "a warning", 0),
        (4, "5/10", 2),
        (5, "mwms-agent: a note", 0),
        (6, "10/10", 0),
    ]


def test_a_flood_of_redraws_through_a_pipe_makes_a_line_per_interval() -> None:
    read_end, write_end = os.pipe()
    emitted: list[tuple[str, bool]] = []
    reader = threading.Thread(
        target=read_output, args=(read_end, lambda text, redraw: emitted.append((text, redraw)))
    )
    reader.start()
    started = time.monotonic()
    with os.fdopen(write_end, "wb") as pipe:
        for block in range(200):  # 200,000 redraws, about 4.6 MB
            pipe.write(b"".join(b"\r%6d/200000 [===>...]" % (block * 1000 + i) for i in range(1000)))
        pipe.write(b"\n")
    reader.join(30)
    elapsed = time.monotonic() - started
    os.close(read_end)
    assert not reader.is_alive()
    assert len(emitted) <= elapsed / 1.0 + 2, (elapsed, emitted)
    assert emitted[-1] == ("199999/200000 [===>...]", len(emitted) > 1)
