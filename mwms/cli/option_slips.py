"""Unknown options, answered with one sentence that says what to do: the command's options closest to what
was typed (`--wokers` -> "did you mean --workers?"), else where its options are listed.

Rules:
- Close matches are `difflib.get_close_matches` over the command's long option names (`--workers`, and the
  `--no-...` side of a flag pair) at least 0.75 similar, at most three, best first.
- The sentence names the command as typed (`mwms token create`), so the answer holds in every sub-command.
- `mwms submit` adds its own hint (options for the program go after `--`) in `mwms.cli.submit`.
"""

from __future__ import annotations

import difflib
from typing import Any

import typer
from typer.core import TyperGroup

# Click's UsageError, whichever click typer uses (its own copy from typer 0.22 on, the click package before).
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
MAX_SUGGESTIONS = 3
# Closer than difflib's default 0.6: '--wokers' should suggest --workers, not --token as well.
MIN_SIMILARITY = 0.75


def long_option_names(command: Any, ctx: Any = None) -> list[str]:
    """Every `--name` a command takes, help included."""
    params = command.get_params(ctx) if ctx is not None else command.params
    names: list[str] = []
    for param in params:
        if param.param_type_name != "option":
            continue
        names += [name for name in [*param.opts, *param.secondary_opts] if name.startswith("--")]
    return names


def close_options(typed: str, command: Any, ctx: Any = None) -> list[str]:
    """The command's option names closest to `typed`, best first (none when nothing is close)."""
    name = typed.split("=", 1)[0]
    return difflib.get_close_matches(
        name, long_option_names(command, ctx), n=MAX_SUGGESTIONS, cutoff=MIN_SIMILARITY
    )


def did_you_mean(matches: list[str]) -> str:
    """'did you mean --workers?' / 'did you mean --a or --b?'"""
    if len(matches) == 1:
        return f"did you mean {matches[0]}?"
    return f"did you mean {', '.join(matches[:-1])} or {matches[-1]}?"


def unknown_option_message(typed: str, command_path: str, matches: list[str]) -> str:
    """The sentence for an option `command_path` does not take."""
    if matches:
        return f"{typed} is not an option of {command_path}; {did_you_mean(matches)}"
    return f"{typed} is not an option of {command_path}: `{command_path} -h` lists its options"


def _reworded(error: Exception) -> Exception:
    """A NoSuchOption turned into the usage error that says what to do; any other error as it was."""
    ctx = getattr(error, "ctx", None)
    if type(error).__name__ != "NoSuchOption" or ctx is None:
        return error
    typed = str(getattr(error, "option_name", ""))
    matches = close_options(typed, ctx.command, ctx)
    return UsageError(unknown_option_message(typed, ctx.command_path, matches), ctx)


class SuggestingGroup(TyperGroup):
    """The `mwms` group: an unknown option of any command below it (or of its own) is answered with the
    closest options of that command."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except UsageError as error:
            reworded = _reworded(error)
            if reworded is error:
                raise
            raise reworded from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as error:
            reworded = _reworded(error)
            if reworded is error:
                raise
            raise reworded from None
