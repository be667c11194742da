"""The one parser of the CLI's duration options (`--expires-in`, `--max-runtime`, `--timeout`, ...).

Rules:
- A duration is a number with its unit: `90s`, `15m`, `12h`, `30d`, `2w`; parts add up (`1h30m`) and a
  part may have a fraction (`0.5s`, `1.5h`). Case and spaces between a number and its unit do not matter.
- A bare number is refused, with a sentence that shows it with each unit: `--expires-in 5` could mean five
  seconds or five days, and guessing wrong is silent. Options whose name ends in a unit (`--timeout-s`,
  `--stop-grace-seconds`) take bare numbers and do not use this parser. The daemons' options
  (`mwms server`, `mwms agent`) take units too, but read a bare number as seconds, as their help says:
  unit files written before they took units must still start.
- `0` alone is accepted where the option allows zero (it is zero in any unit): `--hang-timeout 0` is off.
- Zero where the option needs more than zero, negative, empty or malformed text is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import typer

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
ACCEPTED_FORMS = "90s, 15m, 12h, 30d, 2w or 1h30m"
DURATION_METAVAR = "DURATION"
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)\s*")
_BARE_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")


class DurationError(ValueError):
    """A duration that the rules above refuse; its message says what to write instead."""


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """'30d' -> 2592000.0 seconds, '1h30m' -> 5400.0, '0.5s' -> 0.5; a bare number other than 0 is refused."""
    cleaned = text.strip().lower()
    if allow_zero and _BARE_NUMBER.fullmatch(cleaned) and float(cleaned) == 0:
        return 0.0
    if _BARE_NUMBER.fullmatch(cleaned):
        number = cleaned
        raise DurationError(
            f"{text.strip()} has no unit: write {number}s, {number}m, {number}h or {number}d "
            f"(durations look like {ACCEPTED_FORMS})"
        )
    position, total = 0, 0.0
    while position < len(cleaned):
        match = _PART.match(cleaned, position)
        if match is None or match.group(2) not in DURATION_UNITS:
            raise DurationError(f"{text.strip()!r} is not a duration: write it like {ACCEPTED_FORMS}")
        total += float(match.group(1)) * DURATION_UNITS[match.group(2)]
        position = match.end()
    if not cleaned:
        raise DurationError(f"give a duration, e.g. {ACCEPTED_FORMS}")
    if total <= 0 and not allow_zero:
        raise DurationError(f"{text.strip()} must be longer than zero, e.g. {ACCEPTED_FORMS}")
    return total


def duration_option_parser(
    *,
    allow_zero: bool = False,
    maximum: float | None = None,
    minimum: float | None = None,
    bare_seconds: bool = False,
) -> Callable[[str], float]:
    """A typer `parser=` for a duration option: seconds as a float, or a usage error that says what to
    write. `bare_seconds`: a number without a unit is seconds (the daemons' options) instead of refused."""

    def parse(text: str) -> float:
        if not isinstance(text, str):  # a default that is already seconds
            return float(text)
        try:
            if bare_seconds and _BARE_NUMBER.fullmatch(text.strip()):
                seconds = float(text.strip())
                if seconds == 0 and not allow_zero:
                    raise DurationError(f"{text.strip()} must be longer than zero, e.g. {ACCEPTED_FORMS}")
            else:
                seconds = parse_duration(text, allow_zero=allow_zero)
        except DurationError as error:
            raise typer.BadParameter(str(error)) from None
        if maximum is not None and seconds > maximum:
            raise typer.BadParameter(
                f"{text.strip()} is longer than the most it may be, {format_seconds(maximum)}"
            )
        if minimum is not None and seconds < minimum and not (allow_zero and seconds == 0):
            raise typer.BadParameter(
                f"{text.strip()} is shorter than the least it may be, {format_seconds(minimum)}"
            )
        return seconds

    return parse


def format_seconds(seconds: float) -> str:
    """3600 -> '1h', 90 -> '90s': the largest unit that divides the duration, to quote limits in messages."""
    for unit, size in sorted(DURATION_UNITS.items(), key=lambda item: -item[1]):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
