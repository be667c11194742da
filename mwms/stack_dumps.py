"""The bound on one task's stack dump, shared by the agent that takes it and the coordinator that stores it.

Dependency-free: the agent cuts what py-spy or faulthandler printed to this many bytes of UTF-8
(worker_agent/stacks.py), and the coordinator holds any agent, well-behaved or not, to the same bound.
"""

from __future__ import annotations

MAX_STACK_BYTES = 256 * 1024


def bounded(text: str, who: str, limit: int = MAX_STACK_BYTES) -> str:
    """`text` cut to at most `limit` bytes of UTF-8, ending with a line that says `who` cut it."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    note = f"\n... (cut at {limit // 1024} KiB by {who})\n"
    return data[: limit - len(note.encode())].decode("utf-8", errors="ignore") + note
