"""`with_client`: the one place a command gets --api/--token/--ca-file and an open `Client`."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from mwms.cli.connect import with_client
from mwms.cli.main import app
from mwms.cli.options import JsonOption
from mwms.client import Client
from mwms.errors import NotFound

runner = CliRunner()
CONNECTION_FLAGS = [["--api"], ["--token"], ["--ca-file"]]
# The commands that talk to the coordinator's REST API (login resolves its own, with the token to save).
API_COMMANDS = [
    ["submit"],
    ["jobs"],
    ["agents"],
    ["status"],
    ["logs"],
    ["cancel"],
    ["metrics"],
    ["artifacts"],
    ["stacks"],
    ["doctor"],
    ["whoami"],
    ["remove-agent"],
    *[[group, name] for group in ("token", "agent-token") for name in ("create", "list", "revoke")],
]


def one_command_app(command: Any) -> typer.Typer:
    probe_app = typer.Typer(add_completion=False)
    probe_app.command()(command)
    return probe_app


def test_the_command_gets_an_open_client_for_the_options_and_it_is_closed_after() -> None:
    seen: dict[str, Any] = {}

    @with_client
    def probe(
        client: Client, job_id: Annotated[str, typer.Argument()], json_output: JsonOption = False
    ) -> None:
        seen.update(
            client=client, job_id=job_id, json_output=json_output, open=not client._transport._http.is_closed
        )

    result = runner.invoke(
        one_command_app(probe), ["j-1", "--json", "--api", "http://coordinator:9090", "--token", "t-secret-1"]
    )
    assert result.exit_code == 0, result.output
    client = seen["client"]
    assert (client.api, client.connection.token) == ("http://coordinator:9090", "t-secret-1")
    assert (seen["job_id"], seen["json_output"], seen["open"]) == ("j-1", True, True)
    assert client._transport._http.is_closed


def test_the_options_come_after_the_commands_own_with_their_help() -> None:
    @with_client
    def probe(client: Client, json_output: JsonOption = False) -> None:
        """Probe."""

    command = typer.main.get_command(one_command_app(probe))
    assert [parameter.opts for parameter in command.params] == [["--json"], *CONNECTION_FLAGS]
    help_text = runner.invoke(one_command_app(probe), ["--help"]).output
    assert "MWMS_API" in help_text and "MWMS_TOKEN" in help_text and "MWMS_CA_FILE" in help_text


@pytest.mark.parametrize("argv", API_COMMANDS, ids=" ".join)
def test_every_api_command_takes_the_connection_options_last(argv: list[str]) -> None:
    command: Any = typer.main.get_command(app)
    for name in argv:
        command = command.commands[name]
    assert [parameter.opts for parameter in command.params[-3:]] == CONNECTION_FLAGS


def test_errors_end_the_command_with_the_address_in_the_message() -> None:
    @with_client
    def probe(client: Client) -> None:
        raise NotFound("job 'j-9' not found", status=404)

    result = runner.invoke(one_command_app(probe), ["--api", "http://coordinator:9090"])
    assert result.exit_code == 4
    assert "not found: job 'j-9' not found" in result.stderr


def test_a_command_without_client_first_or_with_its_own_api_option_is_refused() -> None:
    def no_client(json_output: JsonOption = False) -> None: ...

    def own_api(client: Client, api: str = "") -> None: ...

    with pytest.raises(TypeError, match="first parameter"):
        with_client(no_client)
    with pytest.raises(TypeError, match="declares api itself"):
        with_client(own_api)
