"""One task's stack dump as the agent sends it and the coordinator stores it: its bound, and the snapshots
it holds.

Dependency-free: the agent (worker_agent/stacks.py) and the coordinator (server/services/observing/stack_text.py)
both import it.

- **Bound**: the agent cuts what py-spy or faulthandler printed to MAX_STACK_BYTES of UTF-8, and the
  coordinator holds any agent, well-behaved or not, to the same bound.
- **Snapshots**: one snapshot catches a healthy training loop between two collectives as often as inside
  one, so the agent takes SNAPSHOTS of them, SNAPSHOT_SPACING_S apart (about a second in all), and sends
  them as one text: each snapshot after a line `=== mwms snapshot I of N at +S.SSS s ===`. A worker is
  "not in a collective" only when it is outside one in every snapshot. A text without such a line (an
  older agent's) is one snapshot. Both numbers are bounded (MAX_SNAPSHOTS, MAX_SNAPSHOT_SPACING_S), and
  so is each snapshot's share of the bound.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MAX_STACK_BYTES = 256 * 1024
SNAPSHOTS = 3
SNAPSHOT_SPACING_S = 0.5
MAX_SNAPSHOTS = 10
MAX_SNAPSHOT_SPACING_S = 2.0
_MARKER = re.compile(r"^=== mwms snapshot (\d+) of (\d+) at \+(\d+(?:\.\d+)?) s ===$", re.MULTILINE)


def bounded(text: str, who: str, limit: int = MAX_STACK_BYTES) -> str:
    """`text` cut to at most `limit` bytes of UTF-8, ending with a line that says `who` cut it."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    note = f"\n... (cut at {limit // 1024} KiB by {who})\n"
    return data[: limit - len(note.encode())].decode("utf-8", errors="ignore") + note


def snapshot_marker(number: int, total: int, offset_s: float) -> str:
    """The line that opens snapshot `number` (from 1) of `total`, taken `offset_s` after the first."""
    return f"=== mwms snapshot {number} of {total} at +{max(0.0, offset_s):.3f} s ==="


def join_snapshots(texts: Sequence[str], offsets_s: Sequence[float]) -> str:
    """Snapshots (each a tool's dump) as one text, each after its marker line."""
    if len(texts) != len(offsets_s):
        raise ValueError("one offset per snapshot is needed")
    total = len(texts)
    return "".join(
        f"{snapshot_marker(i + 1, total, offset)}\n{text.rstrip()}\n"
        for i, (text, offset) in enumerate(zip(texts, offsets_s, strict=True))
    )


def split_snapshots(text: str) -> list[str]:
    """The snapshots of a dump's text, in the order taken; a text without marker lines is one snapshot,
    an empty text none. At most MAX_SNAPSHOTS are read (a text that claims more is not trusted further)."""
    markers = list(_MARKER.finditer(text))
    if not markers:
        return [text] if text.strip() else []
    parts = []
    for i, marker in enumerate(markers[:MAX_SNAPSHOTS]):
        end = markers[i + 1].start() if i + 1 < len(markers) else len(text)
        parts.append(text[marker.end() : end].strip("\n"))
    return parts
