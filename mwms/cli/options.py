"""Options shared by several commands, declared once.

--api, --token and --ca-file default to "not given": `mwms.connection.resolve_connection` then takes
MWMS_API / MWMS_TOKEN / MWMS_CA_FILE, else what `mwms login` saved, in that one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mwms.connection import DEFAULT_API

ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api",
        help=f"Address of the coordinator's HTTP API; default: MWMS_API, else the address `mwms login` "
        f"saved, else {DEFAULT_API}.",
        show_default=False,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token to send; default: MWMS_TOKEN, else the token `mwms login` saved. Prefer those: "
        "a token on the command line shows up in `ps` and shell history.",
        show_default=False,
    ),
]
CaFileOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        help="PEM CA certificate to trust for an https coordinator (e.g. from `mwms server "
        "--tls-self-signed`); default: MWMS_CA_FILE, else the one `mwms login` saved.",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON objects, and nothing else, on stdout.")
]

__all__ = ["ApiOption", "TokenOption", "CaFileOption", "JsonOption", "DEFAULT_API"]
