"""Options shared by several commands, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from mwms.cli.client import DEFAULT_API

ApiOption = Annotated[
    str,
    typer.Option(
        "--api",
        envvar="MWMS_API",
        help="Address of the coordinator's HTTP API.",
        show_default=True,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the API's JSON objects, and nothing else, on stdout.")
]

__all__ = ["ApiOption", "JsonOption", "DEFAULT_API"]
