"""Field types of the REST contract whose every rule the OpenAPI document states, so that generated
clients and fuzzers send only what is accepted: printable names and text, integers that are integers.

A rule that only a validator knew (isprintable, true taken for 1) would let a schema-valid request be
refused, or an invalid one through. Patterns are written as \\uXXXX ranges, which Python's re (the
services, Hypothesis), Rust's regex (pydantic) and ECMA's (JSON Schema, browsers) read alike; the
validator that refuses applies the same pattern, and says in words what is wrong.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, Strict


def _printable_class(*, space: bool) -> str:
    """A character class of the characters str.isprintable() accepts in the Basic Multilingual Plane.

    Names and reasons are printable (server/services/scheduler/teams.py and cordons.py refuse the rest): a class
    of control characters only would let format, private-use and unassigned ones through. Characters
    beyond the BMP (emoji) are left out: ECMA regexes without the u flag cannot name them."""
    ranges: list[tuple[int, int]] = []
    for code in range(0x10000):
        char = chr(code)
        if not char.isprintable() or (char == " " and not space):
            continue
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    return "[" + "".join(f"\\u{a:04x}" + (f"-\\u{b:04x}" if b > a else "") for a, b in ranges) + "]"


# Printable text (cordon reasons). A name (user, team, token) is printable and not blank; the spaces
# around it are stripped. Each pattern holds one class (about 4 KB): spaces, then a non-space, again.
PRINTABLE_PATTERN = f"^{_printable_class(space=True)}*$"
_NAME = rf"(?:\u0020*{_printable_class(space=False)})+\u0020*"
NAME_PATTERN = f"^{_NAME}$"
OPTIONAL_NAME_PATTERN = f"^(?:{_NAME})?$"
NAME_RULE = "printable characters, not blank (no control characters, line breaks or emoji)"
# What str.strip() removes (str.isspace()), spelled out: \s differs between the three regex dialects.
SPACE_CLASS = r"[\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
NO_NUL_PATTERN = r"^[^\u0000]*$"
# A program word: no NUL anywhere and a character strip() keeps (prefixItems takes the first word out of
# `items`, so its pattern must say both).
PROGRAM_WORD_PATTERN = r"^[^\u0000]*[^\u0000" + SPACE_CLASS[1:] + r"[^\u0000]*$"


def matching(pattern: str, rule: str) -> AfterValidator:
    """A validator that refuses a string that `pattern` does not fully match, saying it must be `rule`."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"must be {rule}")
        return value

    return AfterValidator(check)


def pattern_in_schema(pattern: str) -> Any:
    """The pattern in the document only: the validator beside it refuses, with a readable message
    (pydantic's own would quote a 4 KB regex)."""
    return Field(json_schema_extra={"pattern": pattern})


# A user's, team's or token's name (server/services/auth/tokens.py and teams.py apply the same rule).
PrintableName = Annotated[str, pattern_in_schema(NAME_PATTERN), matching(NAME_PATTERN, NAME_RULE)]


def _integral(value: Any) -> Any:
    # JSON's 2.0 is the integer 2 (JSON Schema says so); true and false stay booleans, refused below.
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer: not true/false for 1/0 nor "3" for 3 (pydantic's lax mode would take them), 2.0 for 2.
# Bounds go in a Field before it inside Annotated (after it, pydantic writes them as unknown keys).
WHOLE_FLOATS_AS_INT = BeforeValidator(_integral)
Integer = Annotated[int, Strict(), WHOLE_FLOATS_AS_INT]
StrictBool = Annotated[bool, Strict()]
