"""Sizes of memory as people write them ("8G", "512MiB", "1.5 GiB", plain bytes) and as they read them.

Units are binary whatever their spelling: K, KB, KiB are 1024 bytes, M 1024², G 1024³, T 1024⁴ (as
cgroups, Docker and Kubernetes' Mi/Gi count memory), case-insensitive.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgtp])(?:i?b?)|b?)\s*", re.IGNORECASE)
SIZE_EXAMPLE = "8G or 512M"


class SizeError(ValueError):
    """A size that cannot be read; its message names what was given and how to write one."""


def parse_size(text: str, what: str = "size") -> int:
    """'8G', '8GiB', '8 gb' -> 8589934592; '512M' -> 536870912; '1.5G'; '1024' and '1024B' are bytes.

    A fraction of a byte is dropped. SizeError, naming `what` (e.g. "--memory-per-worker"), for anything else.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise SizeError(
            f"{what} {text!r}: give a size such as {SIZE_EXAMPLE} (binary units: 1G = 1024³ bytes)"
        )
    number, unit = match.groups()
    factor = _UNITS[(unit or "").lower()]
    # Whole numbers exactly (no float rounding of large byte counts); fractions through float.
    return int(float(number) * factor) if "." in number else int(number) * factor


_NAMES = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def format_size(size: int | float) -> str:
    """8589934592 -> '8 GiB', 1288490188 -> '1.2 GiB', 512 -> '512 B': one decimal at most, none when whole."""
    for factor, name in _NAMES:
        if abs(size) >= factor:
            value = size / factor
            text = f"{value:.1f}".removesuffix(".0")
            return f"{text} {name}"
    return f"{int(size)} B"
