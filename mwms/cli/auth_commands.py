"""`mwms login`, `mwms logout` and `mwms whoami`: saving, forgetting and checking the token the CLI sends."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from mwms.cli import connect
from mwms.cli.connect import with_client
from mwms.cli.errors import CliError, ExitCode, exit_code_for, handles_errors, message_for
from mwms.cli.options import ApiOption, CaFileOption, JsonOption
from mwms.cli.output import err, out, print_json
from mwms.cli.safe_text import safe_text
from mwms.client import Client
from mwms.connection import (
    API_ENV,
    FIRST_ADMIN_TOKEN_HINT,
    TOKEN_ENV,
    StoredConfig,
    config_path,
    forget_token,
    resolve_connection,
    save_config,
)
from mwms.errors import MwmsError

STDIN = "-"


def read_token(token: str | None, token_file: Path | None) -> str:
    """The token from --token, --token-file (either '-' for stdin), or a hidden prompt on a terminal."""
    if token and token_file:
        raise CliError("give the token with --token or with --token-file, not both")
    if token == STDIN or str(token_file) == STDIN:
        secret = sys.stdin.readline()
    elif token:
        secret = token
    elif token_file is not None:
        try:
            secret = token_file.expanduser().read_text()
        except OSError as error:
            raise CliError(f"cannot read --token-file {token_file}: {error.strerror or error}") from None
    elif sys.stdin.isatty():
        secret = typer.prompt("API token", hide_input=True, err=True)
    else:
        raise CliError(
            "no token given: pass --token-file PATH, pipe it with --token-file -, or run on a terminal "
            "to be asked for it"
        )
    secret = secret.strip()
    if not secret:
        raise CliError("the token is empty")
    if any(character.isspace() for character in secret):
        raise CliError("a token is one word; the one given contains spaces or several lines")
    return secret


@handles_errors()
def login(
    api: ApiOption = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="The API token to save; '-' reads it from stdin. Default: ask for it without echoing.",
            show_default=False,
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="Read the token from this file ('-': stdin), e.g. the coordinator's <data dir>/admin-token.",
            show_default=False,
        ),
    ] = None,
    ca_file: CaFileOption = None,
    json_output: JsonOption = False,
) -> None:
    """Check an API token against the coordinator and save it, with the address, for later commands.

    The config file is $MWMS_CONFIG, else $XDG_CONFIG_HOME/mwms/config.json, else
    ~/.config/mwms/config.json, readable by you only. --token and MWMS_TOKEN still take precedence over it.
    """
    secret = read_token(token, token_file)
    if ca_file is not None:
        ca_file = ca_file.expanduser().resolve()
    connection = resolve_connection(api, secret, ca_file)
    try:
        with Client.for_connection(connection, retry_seconds=connect.RETRY_SECONDS) as client:
            identity = client.identity()
    except MwmsError as error:
        if error.status == 401:
            raise CliError(
                f"the coordinator at {connection.api} refused this token (unknown, revoked or expired); "
                f"nothing was saved. Ask an admin for a token (`mwms token create`); "
                f"{FIRST_ADMIN_TOKEN_HINT}",
                ExitCode.NOT_AUTHORIZED,
            ) from None
        raise CliError(message_for(error, connection.api, connection), exit_code_for(error)) from None
    path = save_config(StoredConfig(api=connection.api, token=secret, ca_file=connection.ca_file))
    if json_output:
        print_json({**identity.raw, "api": connection.api, "config_file": str(path)})
    else:
        out.print(safe_text(f"logged in to {connection.api} as {identity.user} ({identity.role})"))
        err.print(f"token saved in {path}")
    if os.environ.get(TOKEN_ENV) and os.environ[TOKEN_ENV].strip() != secret:
        err.print(f"note: {TOKEN_ENV} is set in this shell and takes precedence over the saved token")
    env_api = os.environ.get(API_ENV)
    if env_api and not api and resolve_connection(env_api).api != connection.api:
        err.print(f"note: {API_ENV} is set and names another coordinator")


@handles_errors(api_param=None)
def logout() -> None:
    """Forget the token `mwms login` saved (the coordinator's address stays saved)."""
    path = config_path()
    if forget_token(path):
        out.print(f"removed the saved token from {path}")
    else:
        err.print(f"no token saved in {path}")
    if os.environ.get(TOKEN_ENV):
        err.print(f"note: {TOKEN_ENV} is still set in this shell; commands keep sending it")


@with_client
def whoami(client: Client, json_output: JsonOption = False) -> None:
    """Show the user and role of the token in force, and where it came from."""
    connection = client.connection
    identity = client.identity()
    if json_output:
        print_json(identity.raw)
        return
    out.print(safe_text(f"{identity.user} ({identity.role}) at {connection.api}"))
    name = f"token {identity.token_name!r}" if identity.token_name else "a token"
    err.print(safe_text(f"using {name} from {connection.token_source}"))
