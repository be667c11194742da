"""Printing followed log lines: on a terminal, a redraw (a `\\r` progress bar) overwrites the line it replaces.

An API log line with `redraw: true` is a newer state of the line before it of the same task and stream
(server/services/observing/log_pages.py). On a terminal, when that line is the one printed last, its rows are erased
(rich control codes: cursor up, erase line; never text from the job) and the new state, made safe like any
line, is printed in its place, so one progress line moves. Anywhere else, and with --raw, every state is a
line of its own: the agent sends at most about one a second, so a pipe or file gets a readable history. A
page of newest lines (`mwms logs` without --follow) has no redraws: each line comes as it stands.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.control import Control
from rich.segment import ControlType
from rich.text import Text

from mwms.cli.output import log_line_text, raw_log_line, write_raw


def _rows(text: Text, width: int) -> int:
    """Terminal rows `text` takes when printed soft-wrapped (the terminal wraps it) at `width` columns."""
    expanded = text.copy()
    expanded.expand_tabs()
    return max(1, -(-expanded.cell_len // max(1, width)))


class LogPrinter:
    """Prints API log lines to `console`: `[task I] text` (or the bare text), or --raw bytes."""

    def __init__(self, console: Console, *, prefix: bool, raw: bool) -> None:
        self._console = console
        self._prefix = prefix
        self._raw = raw
        self._overwrite = console.is_terminal and not raw
        # (task, attempt, stream) of the line printed last and the rows it took, None before any.
        self._last: tuple[tuple[Any, Any, Any], int] | None = None

    def show(self, line: dict[str, Any]) -> None:
        """Prints one line, over the line it replaces when it is a redraw of the line printed last."""
        if self._raw:
            write_raw(raw_log_line(line, prefix=self._prefix))
            return
        text = log_line_text(line, prefix=self._prefix)
        key = (line.get("task"), line.get("attempt"), line.get("stream"))
        if self._overwrite and line.get("redraw") and self._last is not None and self._last[0] == key:
            self._erase(self._last[1])
        self._console.print(text)
        self._last = (key, _rows(text, self._console.width))

    def _erase(self, rows: int) -> None:
        """Erases the `rows` rows above the cursor, leaving it at the start of the topmost."""
        codes: list[ControlType | tuple[ControlType, int]] = [(ControlType.CURSOR_MOVE_TO_COLUMN, 0)]
        for _ in range(rows):
            codes += [(ControlType.CURSOR_UP, 1), (ControlType.ERASE_IN_LINE, 2)]
        self._console.control(Control(*codes))
