"""Small helpers for the sentences people read in reasons and messages."""

from __future__ import annotations


def count(number: int, noun: str, plural: str | None = None) -> str:
    """'1 worker', '2 workers', '1 CPU slot', '3 GPUs'."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"
