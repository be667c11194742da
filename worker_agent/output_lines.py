"""A task's output stream cut into log lines, with `\\r` redraws (progress bars) sent as newer states of a line.

A `\\n` ends a line (a `\\r\\n` too: it is a plain line end). A `\\r` not followed by `\\n` means "the current
line is redrawn": what follows replaces what came before on the same line, as a terminal shows it. Keras'
`fit(verbose=1)` and tqdm redraw a line this way many times a second; joined into one line they made a
5.8 KB line per epoch and showed no progress inside it.

A line being redrawn is sent as it stands at most once per `REDRAW_INTERVAL_S` (a program printing 10,000
redraws a second costs one `rfind` per read, not one line per redraw), and once more, final, when its `\\n`
comes. The first state sent of a line is a plain line; every later state of it (the final one included) is
emitted with `redraw=True`: "replaces the line emitted before it from this stream". The state of a line is
the text after its last `\\r`, or, while that is empty (or, before the line ends, shorter: perhaps cut by
the pipe), the text between its last two `\\r`s. Keras writes backspaces and `\\r` before each new state:
trailing backspaces are dropped. Other control characters and escape sequences pass through untouched, for
the readers to make safe (mwms/cli/safe_text.py).

A line longer than `MAX_LINE_BYTES` is emitted in pieces, so a program printing without newlines cannot
exhaust the agent's memory; every buffer here is bounded by it.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable

# A line longer than this is delivered in pieces.
MAX_LINE_BYTES = 64 * 1024
# Bytes asked of the pipe per read.
READ_BYTES = 64 * 1024
# A line being redrawn is sent at most this often (its final state is sent when it ends, whenever that is).
REDRAW_INTERVAL_S = 1.0

# emit(text, redraw): `redraw` is True when the text is a newer state of the line emitted just before.
Emit = Callable[[str, bool], None]


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class OutputLines:
    """Cuts one stream's bytes (`feed`) into lines for `emit`; `send_due` sends a redrawn line's newest
    state when one is due, `close` the unfinished last line at the end of the stream."""

    def __init__(
        self,
        emit: Emit,
        *,
        redraw_interval_s: float = REDRAW_INTERVAL_S,
        max_line_bytes: int = MAX_LINE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self._interval = redraw_interval_s
        self._max = max_line_bytes
        self._clock = clock
        # The current line: the text after its last `\r`, and (once it had a `\r`) the state before it.
        self._tail = b""
        self._drawn: bytes | None = None
        self._sent: bytes | None = None  # the state of the current line emitted last, None when none yet
        self._unsent = False  # the line was redrawn since its state was last emitted
        self._last_redraw = -float("inf")  # when a redrawn state was last emitted (the rate limit)

    def feed(self, data: bytes) -> None:
        """Takes the next bytes of the stream; emits the lines they end, and a redrawn state when due."""
        # A `\r\n` split across two reads needs no care: its `\r` leaves the state the `\n` then ends.
        *ended, rest = data.split(b"\n")
        for piece in ended:
            self._end_line(piece[:-1] if piece.endswith(b"\r") else piece)
        self._extend(rest)
        self.send_due()

    def seconds_until_due(self) -> float | None:
        """How long until a redrawn state is due (0 when it is), None when there is nothing to send."""
        if not self._unsent:
            return None
        return max(0.0, self._last_redraw + self._interval - self._clock())

    def send_due(self) -> None:
        """Emits the current line's newest state if it was redrawn and the rate limit allows."""
        if not self._unsent or self._clock() - self._last_redraw < self._interval:
            return
        self._unsent = False
        state = self._state()
        if not state or state == self._sent:
            return
        self._last_redraw = self._clock()
        self._emit(_decode(state), self._sent is not None)
        self._sent = state

    def close(self) -> None:
        """The stream ended: emits the unfinished last line's final state, if it has any text."""
        if self._tail or self._drawn is not None:
            self._end_line(b"")

    def _state(self, final: bool = False) -> bytes:
        """The current line as it stands: the text after its last `\\r`, trailing backspaces dropped.

        Until the line ends, a text after the `\\r` shorter than the state before it may be a state the pipe
        cut (a program that does not flush each redraw): the state before it stands meanwhile.
        """
        tail = self._tail.rstrip(b"\b")
        if self._drawn is None or (tail and (final or len(tail) >= len(self._drawn))):
            return tail
        return self._drawn

    def _extend(self, piece: bytes) -> None:
        """Adds text without a `\\n` to the current line."""
        cut = piece.rfind(b"\r")
        if cut < 0:
            self._tail += piece
        else:
            before = piece[:cut]
            previous_cut = before.rfind(b"\r")
            segment = (self._tail + before) if previous_cut < 0 else before[previous_cut + 1 :]
            segment = segment.rstrip(b"\b")[: self._max]
            if segment or self._drawn is None:
                self._drawn = segment
            self._tail = piece[cut + 1 :]
            self._unsent = True
        while len(self._tail) >= self._max:
            # A line this long is not a progress bar: its pieces are plain lines.
            self._emit(_decode(self._tail[: self._max]), self._sent is not None)
            self._tail = self._tail[self._max :]
            self._reset_line()

    def _end_line(self, piece: bytes) -> None:
        self._extend(piece)
        state = self._state(final=True)
        if state != self._sent:
            self._emit(_decode(state), self._sent is not None)
        self._tail = b""
        self._reset_line()

    def _reset_line(self) -> None:
        self._drawn = None
        self._sent = None
        self._unsent = False


def read_output(fd: int, emit: Emit, *, redraw_interval_s: float = REDRAW_INTERVAL_S) -> None:
    """Reads the pipe `fd` until its end, emitting its lines (OutputLines); returns when the stream ends.

    A redrawn state due while the program prints nothing is sent on time: the read waits (poll) no longer
    than until then. The caller closes `fd`.
    """
    lines = OutputLines(emit, redraw_interval_s=redraw_interval_s)
    poller = select.poll()  # not select(): an agent with many tasks has descriptors past 1024
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        wait = lines.seconds_until_due()
        if wait is not None and not poller.poll(wait * 1000):
            lines.send_due()
            continue
        try:
            data = os.read(fd, READ_BYTES)
        except OSError:
            break
        if not data:
            break
        lines.feed(data)
    lines.close()
