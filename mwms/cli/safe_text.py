"""Text from the API made safe for a terminal: the one home of what the CLI strips before printing.

Names, reasons, messages, log lines, metric names and stack frames come from users and their programs. Raw,
they can drive the operator's terminal: ``ESC ] 0 ; … BEL`` sets the window title, ``ESC ] 8 ; ;`` makes a
link, ``ESC [ 2 J`` clears the screen, ``ESC P $ q … ESC \\`` (DECRQSS) makes the terminal type a reply into
the shell, ``CR`` and cursor moves overwrite lines already printed, bidi overrides make text read other than
it is stored. And rich would read ``[/]`` or ``[link=…]`` in them as markup (a ``MarkupError`` for ``[/]``).

`terminal_safe` removes, keeping every other character (non-ASCII and emoji included):

- whole escape sequences, 7-bit and 8-bit introducers alike: CSI (``ESC [`` or U+009B, parameters,
  intermediates, a final byte), OSC (``ESC ]`` / U+009D) and DCS, SOS, PM, APC (``ESC P X ^ _`` /
  U+0090 U+0098 U+009E U+009F) up to BEL or ST (``ESC \\`` / U+009C), and the other ``ESC`` sequences
  (``ESC`` + intermediates 0x20-0x2F + one final 0x30-0x7E, e.g. ``ESC c``, ``ESC # 8``, ``ESC ( B``);
- what is left of broken ones: an unterminated string sequence loses its introducer, its text stays
  visible; a lone ``ESC`` (at the end, or before a byte that starts no sequence) is dropped;
- C0 controls but newline and tab, DEL, C1 controls (U+0080-U+009F);
- the bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069);
- lone surrogates become U+FFFD, since writing them to a UTF-8 terminal fails.

The result contains no ``ESC`` and no control but ``\\n`` and ``\\t``, so `terminal_safe` is idempotent.
`safe_text` wraps it in a rich ``Text``, which rich never parses as markup. The CLI's consoles
(`mwms.cli.output`) are `SafeConsole`s with markup and emoji codes off that pass every segment they write
through `terminal_safe` as well: a net under the explicit calls, for text that reaches them by another path.
Only ``mwms logs --raw`` writes stored text unchanged, with a plain write, for pipes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

_STRING_TERMINATOR = r"(?:\x07|\x1b\\|\x9c)"
_ESCAPE_SEQUENCE = re.compile(
    # OSC, DCS, SOS, PM, APC: introducer, a body without ESC, BEL or ST, then the terminator.
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*"
    + _STRING_TERMINATOR
    # CSI: parameter bytes, intermediate bytes, one final byte.
    + r"|(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    # Every other ESC sequence, and the introducer of a broken one.
    + r"|\x1b[\x20-\x2f]*[\x30-\x7e]"
    # Whatever is left: single controls, bidi formatting, lone surrogates.
    + r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _replacement(match: re.Match[str]) -> str:
    return "\ufffd" if "\ud800" <= match.group()[0] <= "\udfff" else ""


def terminal_safe(text: object) -> str:
    """`text` (str() of it; None is "") without escape sequences, controls but \\n and \\t, and bidi overrides."""
    value = "" if text is None else text if isinstance(text, str) else str(text)
    if _UNSAFE.search(value) is None:
        return value
    return _ESCAPE_SEQUENCE.sub(_replacement, value)


def safe_text(text: object, style: str = "") -> Text:
    """Untrusted text as a rich Text: made `terminal_safe`, and never read as markup."""
    return Text(terminal_safe(text), style=style)


class SafeConsole(Console):
    """A rich Console that writes no control characters it was not asked to by rich itself.

    Markup and emoji codes are off, so a string prints as it is; a string (printed, or a table cell) is made
    `terminal_safe` before rich reads it, and every text segment rendered is passed through it again (for a
    Text built from raw text elsewhere). rich's own styles (SGR colours) and cursor moves are not text but a
    segment's style and control codes, and stay.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(markup=False, emoji=False, **options)

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(terminal_safe(text), **options)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or _UNSAFE.search(segment.text) is None:
                yield segment
            else:
                yield Segment(terminal_safe(segment.text), segment.style, segment.control)
