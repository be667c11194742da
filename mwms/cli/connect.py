"""How a CLI command gets its `mwms.Client`: --api / --token / --ca-file, else MWMS_*, else `mwms login`.

A command that talks to the coordinator takes `client: Client` as its first parameter and is decorated
with `@with_client`; the decorator declares the three options, opens the client before the command runs,
closes it after, and ends the command's errors as `handles_errors` does.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from mwms.cli.errors import handles_errors
from mwms.cli.options import ApiOption, CaFileOption, TokenOption
from mwms.cli.safe_text import terminal_safe
from mwms.client import Client

# A person at a prompt waits this long for a restarting coordinator before being told it is unreachable;
# following a job (submit --wait, quickstart) tolerates longer outages on top (Job.wait).
RETRY_SECONDS = 10.0

# The options `with_client` adds, in this order, after a command's own (where --help lists them).
CONNECTION_OPTIONS: dict[str, Any] = {"api": ApiOption, "token": TokenOption, "ca_file": CaFileOption}

P = ParamSpec("P")
R = TypeVar("R")


def connect(
    api: str | None = None,
    token: str | None = None,
    ca_file: str | Path | None = None,
    *,
    timeout: float = 30.0,
) -> Client:
    """A client for the coordinator that --api / MWMS_API / `mwms login` name, with the token in force;
    a retry is announced on stderr at once, so a wait for an unreachable coordinator is never silent."""
    return Client(api, token, ca_file, timeout=timeout, retry_seconds=RETRY_SECONDS, on_retry=announce_retry)


def announce_retry(notice: str) -> None:
    """Prints the transport's first-retry notice on stderr (made terminal-safe: it quotes the network)."""
    print(f"note: {terminal_safe(notice)} (Ctrl-C to stop)", file=sys.stderr)


def with_client(command: Callable[Concatenate[Client, P], R]) -> Callable[..., R]:
    """Makes `command(client, ...)` a typer command with --api/--token/--ca-file, given an open client."""
    signature = inspect.signature(command, eval_str=True)
    own = list(signature.parameters.values())
    if not own or own[0].name != "client":
        raise TypeError(f"{command.__name__} must take `client` as its first parameter")
    own = own[1:]
    clashes = sorted(CONNECTION_OPTIONS.keys() & {parameter.name for parameter in own})
    if clashes:
        raise TypeError(f"{command.__name__} declares {', '.join(clashes)} itself; with_client adds them")
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        for name, annotation in CONNECTION_OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        api: str | None = None,
        token: str | None = None,
        ca_file: Path | None = None,
        **kwargs: Any,
    ) -> R:
        with connect(api, token, ca_file) as client:
            return command(client, *args, **kwargs)

    # typer reads the parameters from __signature__ and their types from __annotations__: give it the
    # command's own (resolved, as `from __future__ import annotations` leaves strings) plus the three.
    parameters = [*own, *added]
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    wrapper.__annotations__["return"] = signature.return_annotation
    return handles_errors()(wrapper)
