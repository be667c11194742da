"""Followed log lines in the CLI (mwms/cli/log_printer.py): on a terminal a redraw overwrites the line it
replaces, the rows a wrapped line took included; to a pipe every state is a line; nothing a job prints can
move the cursor."""

from __future__ import annotations

import io

from mwms.cli.log_printer import LogPrinter
from mwms.cli.safe_text import SafeConsole

UP_AND_ERASE = "\x1b[1A\x1b[2K"


def console(terminal: bool, width: int = 40) -> tuple[SafeConsole, io.StringIO]:
    sink = io.StringIO()
    return SafeConsole(
        file=sink, force_terminal=terminal, width=width, soft_wrap=True, color_system=None
    ), sink


def line(text: str, redraw: bool = False, stream: str = "stdout", task: int = 0) -> dict:
    return {"task": task, "attempt": 1, "stream": stream, "text": text, "redraw": redraw}


def test_on_a_terminal_a_redraw_overwrites_the_line_printed_last() -> None:
    terminal, sink = console(terminal=True)
    printer = LogPrinter(terminal, prefix=False, raw=False)
    for each in [line("Epoch 1"), line("1/3"), line("2/3", redraw=True), line("3/3 done", redraw=True)]:
        printer.show(each)
    assert sink.getvalue() == (
        "Epoch 1\n1/3\n" + "\x1b[1G" + UP_AND_ERASE + "2/3\n" + "\x1b[1G" + UP_AND_ERASE + "3/3 done\n"
    )


def test_a_redraw_after_a_line_of_another_stream_or_task_is_a_line_of_its_own() -> None:
    terminal, sink = console(terminal=True)
    printer = LogPrinter(terminal, prefix=True, raw=False)
    printer.show(line("1/3"))
    printer.show(line("warning", stream="stderr"))
    printer.show(line("2/3", redraw=True))
    printer.show(line("other task", task=1))
    printer.show(line("3/3", redraw=True))
    assert UP_AND_ERASE not in sink.getvalue()
    assert sink.getvalue().splitlines() == [
        "[task 0] 1/3",
        "[task 0] warning",
        "[task 0] 2/3",
        "[task 1] other task",
        "[task 0] 3/3",
    ]


def test_a_wrapped_line_is_erased_row_by_row() -> None:
    terminal, sink = console(terminal=True, width=10)
    printer = LogPrinter(terminal, prefix=False, raw=False)
    printer.show(line("x" * 25))  # three rows at 10 columns
    printer.show(line("short", redraw=True))
    assert sink.getvalue() == "x" * 25 + "\n" + "\x1b[1G" + UP_AND_ERASE * 3 + "short\n"


def test_the_text_of_a_redraw_is_made_safe_and_cannot_move_the_cursor() -> None:
    terminal, sink = console(terminal=True)
    printer = LogPrinter(terminal, prefix=False, raw=False)
    printer.show(line("1/3"))
    printer.show(line("\x1b[2A\x1b[2J\r2/3\x08", redraw=True))
    assert sink.getvalue() == "1/3\n" + "\x1b[1G" + UP_AND_ERASE + "2/3\n"


def test_to_a_pipe_and_raw_every_state_is_a_line() -> None:
    piped, sink = console(terminal=False)
    printer = LogPrinter(piped, prefix=False, raw=False)
    for each in [line("1/3"), line("2/3", redraw=True), line("3/3", redraw=True)]:
        printer.show(each)
    assert sink.getvalue() == "1/3\n2/3\n3/3\n"
    terminal, sink = console(terminal=True)
    assert LogPrinter(terminal, prefix=False, raw=True)._overwrite is False
