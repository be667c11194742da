"""Small helpers for the sentences people read in reasons and messages."""

from __future__ import annotations


def count(number: int, noun: str, plural: str | None = None) -> str:
    """'1 worker', '2 workers', '1 CPU slot', '3 GPUs'."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"


def listed(items: list[str], at_most: int) -> str:
    """'0', '0 and 1', '0, 1 and 2'; past `at_most` items, '0, 1, 2 and 5 more'."""
    if len(items) > at_most:
        return f"{', '.join(items[:at_most])} and {len(items) - at_most} more"
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"
