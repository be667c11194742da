"""Exit codes, the CLI's own error type, and the one place that turns errors into a message and a code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from enum import IntEnum
from typing import Any, TypeVar

import typer

from mwms.cli.client import ApiError

F = TypeVar("F", bound=Callable[..., Any])


class ExitCode(IntEnum):
    OK = 0
    JOB_NOT_SUCCEEDED = 1  # the job ended, but not SUCCEEDED
    USAGE = 2  # bad usage, or the API rejected the request
    UNREACHABLE = 3  # the coordinator cannot be reached (or failed to answer)
    NOT_FOUND = 4  # unknown job id (or other missing object)
    INTERRUPTED = 130  # Ctrl-C


EXIT_CODES_HELP = (
    "Exit codes: 0 success; "
    "1 the job ended but not SUCCEEDED (submit --wait, quickstart); "
    "2 bad usage or the API rejected the request; "
    "3 the coordinator cannot be reached or failed (start one with `mwms server`); "
    "4 not found (unknown job id); "
    "130 interrupted."
)


class CliError(Exception):
    """An expected failure: printed as one line on stderr, then the process exits with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def exit_code_for(error: ApiError) -> ExitCode:
    """The exit code that an API error maps to."""
    if error.status is None or error.status >= 500:
        return ExitCode.UNREACHABLE
    if error.status == 404:
        return ExitCode.NOT_FOUND
    return ExitCode.USAGE


def message_for(error: ApiError, api: str) -> str:
    """One line that says what went wrong and, where it helps, what to do."""
    if error.status is None:
        return (
            f"cannot reach the mwms coordinator at {api} ({error.detail}); "
            "start one with `mwms server`, or point --api / MWMS_API at a running one"
        )
    if error.status >= 500:
        return f"the coordinator at {api} failed (HTTP {error.status}): {error.detail}"
    if error.status == 404:
        return f"not found: {error.detail}"
    return f"rejected by the coordinator (HTTP {error.status}): {error.detail}"


def fail(message: str, code: ExitCode) -> typer.Exit:
    """Prints `message` on stderr and returns the typer.Exit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(int(code))


def handles_errors(api_param: str | None = "api") -> Callable[[F], F]:
    """Decorates a command so ApiError / CliError / Ctrl-C end it with one stderr line and the right code."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return command(*args, **kwargs)
            except ApiError as error:
                api = str(kwargs.get(api_param, "the API")) if api_param else "the API"
                raise fail(message_for(error, api), exit_code_for(error)) from None
            except CliError as error:
                raise fail(error.message, error.code) from None
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
                raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

        return wrapper  # type: ignore[return-value]

    return decorate
