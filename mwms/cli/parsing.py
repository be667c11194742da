"""Parsers for option values that need more than a type: K=V pairs, port ranges, priorities;
and the slips of `mwms submit` arguments that can be told before anything is uploaded."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path

from mwms.cli.errors import CliError
from mwms.priorities import MAX_PRIORITY, PRIORITY_NAMES

MIN_PORT = 1024
MAX_PORT = 65535


def parse_env(pairs: list[str]) -> dict[str, str]:
    """['A=1', 'B=x=y'] -> {'A': '1', 'B': 'x=y'}; a pair without '=' or with an empty name is refused."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise CliError(f"--env {pair!r} has no '='; write it as NAME=VALUE, e.g. --env BATCH_SIZE=64")
        if not name.strip():
            raise CliError(f"--env {pair!r} has an empty name; write it as NAME=VALUE")
        env[name] = value
    return env


def _split_range(text: str, option: str, example: str) -> tuple[int, int]:
    """'LO-HI' as two integers, or a CliError naming `option` with an `example`."""
    low_text, sep, high_text = text.partition("-")
    try:
        if not sep:
            raise ValueError
        return int(low_text), int(high_text)
    except ValueError:
        raise CliError(f"{option} {text!r} must look like LO-HI, e.g. {example}") from None


def parse_port_range(text: str) -> tuple[int, int]:
    """'20000-20999' -> (20000, 20999); both ends inside 1024..65535 and LO <= HI."""
    low, high = _split_range(text, "--port-range", "20000-20999")
    if not (MIN_PORT <= low <= MAX_PORT and MIN_PORT <= high <= MAX_PORT):
        raise CliError(f"--port-range {text!r}: both ports must be between {MIN_PORT} and {MAX_PORT}")
    if low > high:
        raise CliError(f"--port-range {text!r}: LO ({low}) must not be greater than HI ({high})")
    return low, high


# Task uids: unprivileged (never root, 0) and below the 32-bit "no uid" values (-1, -2 as unsigned).
MIN_TASK_UID, MAX_TASK_UID = 1, 4_294_967_293


def parse_uid_range(text: str) -> tuple[int, int]:
    """'60000-60999' -> (60000, 60999): the uids an agent running as root gives its tasks."""
    low, high = _split_range(text, "--task-uids", "60000-60999")
    if not (MIN_TASK_UID <= low <= high <= MAX_TASK_UID):
        raise CliError(
            f"--task-uids {text!r}: need {MIN_TASK_UID} <= LO <= HI <= {MAX_TASK_UID} (uid 0 is root)"
        )
    return low, high


def parse_priority(text: str, option: str = "--priority") -> int | str:
    """'700' -> 700, 'High' -> 'high' (the coordinator maps the names); anything else is refused."""
    value = text.strip().lower()
    if value in PRIORITY_NAMES:
        return value
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= MAX_PRIORITY:
        raise CliError(
            f"{option} {text!r} must be a number from 0 to {MAX_PRIORITY} (higher is placed first) or one "
            "of low (250), normal (500), high (750)"
        )
    return number


# -- `mwms submit` slips: options of the program without `--`, a command given as one string ------------


def _option_arities(options: Iterable[tuple[list[str], bool]]) -> dict[str, bool]:
    """{'--workers': True, '--wait': False, ...}: whether each option string takes a value."""
    return {name: takes_value for names, takes_value in options for name in names}


def _known_option(token: str, arities: dict[str, bool]) -> tuple[bool, int]:
    """(whether `token` is one of `arities`, how many tokens it takes with its value)."""
    name, has_value, _ = token.partition("=")
    if name in arities:
        return True, 1 if has_value or not arities[name] else 2
    if not token.startswith("--") and token[:2] in arities and arities[token[:2]]:
        return True, 1  # -n2
    return False, 0


def corrected_submit_line(args: list[str], options: Iterable[tuple[list[str], bool]]) -> list[str] | None:
    """`mwms submit` arguments with the program's own options behind `--`, as they were meant; None when
    where the program starts cannot be told. `options`: (option strings, takes a value) of submit.

    The first positional is DIR; the program starts at the next one (or, when DIR names a file such as
    train.py, it is the program: DIR becomes its folder). Options of submit before the first unknown
    option stay submit's; from the first unknown one on, everything belongs to the program."""
    arities = _option_arities(options)
    ours: list[str] = []
    directory: str | None = None
    program: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        if token == "--":
            return None
        if token.startswith("-") and token != "-":
            known, width = _known_option(token, arities)
            if known:
                ours += args[index : index + width]
                index += width
                continue
            if not program and directory is not None and Path(directory).is_file():
                program = _program_of_file(directory)
                directory = str(Path(directory).parent)
            if not program:
                return None
            program += args[index:]
            break
        if directory is None:
            directory = token
        else:
            program.append(token)
        index += 1
    if directory is None or not program:
        return None
    if not any(t.partition("=")[0] == "--workers" or t.startswith("-n") for t in ours):
        ours += ["--workers", "1"]  # required: the corrected line must run as shown
    return [directory, *ours, "--", *program]


def _program_of_file(path: str) -> list[str]:
    name = Path(path).name
    return ["python", name] if name.endswith(".py") else [f"./{name}"]


def check_command_words(command: list[str], directory: Path) -> None:
    """Refuses a command given as one string ("python train.py --epochs 1"), which no agent can execute,
    unless that one word names an existing file (in `directory`, the bundle, or as a path)."""
    first = command[0] if command else ""
    if not any(c.isspace() for c in first):
        return
    if (directory / first).exists() or Path(first).exists():
        return
    try:
        words = shlex.split(first) + command[1:]
    except ValueError:
        words = first.split() + command[1:]
    raise CliError(
        f"the command {first!r} is one word with spaces in it, and no agent can run a program of that "
        f"name: pass its words separately, e.g. mwms submit {shlex.quote(str(directory))} --workers N -- "
        f"{shlex.join(words)}"
    )
