"""Exit codes, the CLI's own error type, and the one place that turns errors into a message and a code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from enum import IntEnum
from typing import Any, TypeVar

import typer

from mwms.cli.safe_text import terminal_safe
from mwms.connection import FIRST_ADMIN_TOKEN_HINT, TOKEN_ENV, Connection, resolve_connection
from mwms.errors import (
    ConfigError,
    CoordinatorUnreachable,
    Forbidden,
    MwmsError,
    NotACoordinator,
    NotFound,
    ServerError,
    Unauthorized,
)

F = TypeVar("F", bound=Callable[..., Any])


class ExitCode(IntEnum):
    OK = 0
    JOB_NOT_SUCCEEDED = 1  # the job ended, but not SUCCEEDED
    WAIT_TIMED_OUT = 1  # a --wait gave up (agent drain --wait --timeout); an alias of 1
    USAGE = 2  # bad usage, or the API rejected the request
    UNREACHABLE = 3  # the coordinator cannot be reached (or failed to answer)
    NOT_FOUND = 4  # unknown job id (or other missing object)
    NOT_AUTHORIZED = 5  # no valid token (HTTP 401) or a role that may not (HTTP 403)
    INTERRUPTED = 130  # Ctrl-C


# Shorter "tokens" (typos, '-') are not searched for in messages: they would garble them.
MIN_SCRUBBED_LENGTH = 8

EXIT_CODES_HELP = (
    "Exit codes: 0 success; "
    "1 the job ended but not SUCCEEDED (submit --wait, quickstart), or a --wait timed out (agent drain); "
    "2 bad usage or the API rejected the request; "
    "3 the coordinator cannot be reached or failed (start one with `mwms server`); "
    "4 not found (unknown job id); "
    "5 not logged in, the token was refused, or its role may not do this (`mwms login`, MWMS_TOKEN); "
    "130 interrupted."
)


class CliError(Exception):
    """An expected failure: printed as one line on stderr, then the process exits with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def exit_code_for(error: MwmsError) -> ExitCode:
    """The exit code that a client error maps to."""
    if isinstance(error, (CoordinatorUnreachable, ServerError)):
        return ExitCode.UNREACHABLE
    if isinstance(error, NotFound):
        return ExitCode.NOT_FOUND
    if isinstance(error, Unauthorized):
        return ExitCode.NOT_AUTHORIZED
    return ExitCode.USAGE


def message_for(error: MwmsError, api: str, connection: Connection | None = None) -> str:
    """One line that says what went wrong and, where it helps, what to do; never the token itself."""
    detail = error.detail
    if connection is not None and len(connection.token) >= MIN_SCRUBBED_LENGTH:
        detail = detail.replace(connection.token, "<token>")
    if isinstance(error, ConfigError):
        return detail
    if isinstance(error, CoordinatorUnreachable) and error.status is not None:
        return f"the coordinator at {api} is unavailable (HTTP {error.status}): {detail}"
    if error.status is None and not isinstance(error, CoordinatorUnreachable):
        return detail  # found on this side, e.g. a program directory that does not exist
    if isinstance(error, NotACoordinator):
        return detail
    if error.status is None:
        if detail.startswith("nothing answers at "):
            return (
                f"nothing answers at {api}: is the coordinator running? start one with `mwms server` "
                "or check --api/MWMS_API"
            )
        if "CERTIFICATE_VERIFY_FAILED" in detail:
            return (
                f"the coordinator at {api} has a certificate this machine does not trust ({detail}); "
                "pass its CA certificate with --ca-file or MWMS_CA_FILE"
            )
        return (
            f"cannot reach the mwms coordinator at {api} ({detail}); "
            "start one with `mwms server`, or point --api / MWMS_API at a running one"
        )
    if isinstance(error, Forbidden):
        return f"not allowed: {detail}"
    if isinstance(error, Unauthorized):
        return unauthenticated_message(api, connection, error.expired_at)
    if error.status >= 500:
        return f"the coordinator at {api} failed (HTTP {error.status}): {detail}"
    if error.status == 404:
        return f"not found: {detail}"
    return f"rejected by the coordinator (HTTP {error.status}): {detail}"


def unauthenticated_message(
    api: str, connection: Connection | None, expired_at: datetime | None = None
) -> str:
    """What to do after a 401: which token was refused (by where it came from), why when the coordinator
    said (`expired_at`, from its 401), and how to get one; never "set MWMS_TOKEN" when that is where the
    refused one is."""
    if connection is None or not connection.token:
        how = f"log in with `mwms login --api {api}`, pass --token, or set MWMS_TOKEN ({FIRST_ADMIN_TOKEN_HINT})"
        elsewhere = ""
        if connection is not None and connection.config_api and connection.config_api != api:
            elsewhere = f" (the token saved by `mwms login` is for {connection.config_api})"
        return f"the coordinator at {api} needs an API token and none was given{elsewhere}; {how}"
    expired = expired_at is not None
    when = expired_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if expired_at else ""
    why = f"it expired at {when}" if expired else "unknown, revoked or expired"
    new = "ask an admin for a new one (`mwms token create`)" if expired else "use a valid one"
    source = connection.token_source
    if source == TOKEN_ENV:
        how = f"{new} and put it in {TOKEN_ENV}, or unset {TOKEN_ENV} and run `mwms login --api {api}`"
    elif source == "--token":
        how = f"{new} and pass it with --token"
    else:  # the config file `mwms login` wrote
        how = f"{new} and run `mwms login --api {api}` with it"
    if not expired:
        how += f" ({FIRST_ADMIN_TOKEN_HINT})"
    return f"the coordinator at {api} refused the token from {source} ({why}); {how}"


def fail(message: str, code: ExitCode) -> typer.Exit:
    """Prints `message` on stderr, made `terminal_safe` (it quotes what the server and users sent), and
    returns the typer.Exit to raise."""
    print(f"error: {terminal_safe(message)}", file=sys.stderr)
    return typer.Exit(int(code))


def _connection_of(arguments: dict[str, Any], api_param: str) -> Connection | None:
    """The connection a command's --api/--token/--ca-file arguments resolve to, for error messages."""
    try:
        return resolve_connection(arguments.get(api_param), arguments.get("token"), arguments.get("ca_file"))
    except ConfigError:
        return None


def handles_errors(api_param: str | None = "api") -> Callable[[F], F]:
    """Decorates a command so MwmsError / CliError / Ctrl-C end it with one stderr line and the right code."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return command(*args, **kwargs)
            except ConfigError as error:
                raise fail(str(error), ExitCode.USAGE) from None
            except MwmsError as error:
                connection = _connection_of(kwargs, api_param) if api_param else None
                api = connection.api if connection else "the API"
                raise fail(message_for(error, api, connection), exit_code_for(error)) from None
            except CliError as error:
                raise fail(error.message, error.code) from None
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
                raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

        return wrapper  # type: ignore[return-value]

    return decorate
