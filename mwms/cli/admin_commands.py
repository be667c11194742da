"""Admin commands: `mwms token ...` (API tokens), `mwms agent-token ...` (join tokens), `mwms remove-agent`.

A token's secret is printed once, by `create`, alone on stdout so that `T=$(mwms token create ...)` works;
the notes about it go to stderr. Listings never contain secrets: the API does not keep them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from mwms.agent_references import AmbiguousAgent, UnknownAgent, resolve_agent_reference
from mwms.cli.connect import connect
from mwms.cli.errors import CliError, ExitCode, handles_errors
from mwms.cli.options import ApiOption, CaFileOption, JsonOption, TokenOption
from mwms.cli.output import cells, err, format_time, out, parse_time, print_json
from mwms.cli.parsing import parse_duration
from mwms.cli.safe_text import safe_text, terminal_safe

ROLES = ("admin", "user", "viewer")
SUB_APP_SETTINGS: dict[str, Any] = {
    "no_args_is_help": True,
    "rich_markup_mode": None,
    "context_settings": {"help_option_names": ["-h", "--help"]},
}

token_app = typer.Typer(
    name="token",
    help="API tokens for people and scripts: create, list, revoke (admin only).",
    **SUB_APP_SETTINGS,
)
agent_token_app = typer.Typer(
    name="agent-token",
    help="Join tokens that admit agents (`mwms agent` reads one from MWMS_JOIN_TOKEN or --join-token-file): "
    "create, list, revoke (admin only).",
    **SUB_APP_SETTINGS,
)

TokenIdArgument = Annotated[str, typer.Argument(help="The token's id, as `list` shows it.")]
ExpiresInOption = Annotated[
    str | None,
    typer.Option(
        "--expires-in", help="Lifetime, e.g. 30d, 12h, 90m, 2w; default: never expires.", show_default=False
    ),
]


def token_status(token: dict[str, Any], now: datetime | None = None) -> Text:
    """active, revoked or expired."""
    if token.get("revoked_at"):
        return Text("revoked", style="bright_black")
    expires = parse_time(token.get("expires_at"))
    if expires is not None and expires <= (now or datetime.now(timezone.utc)):
        return Text("expired", style="bright_black")
    return Text("active", style="green")


def tokens_table(tokens: list[dict[str, Any]], *, with_user: bool) -> Table:
    table = Table(box=None, header_style="bold")
    columns = ["ID", *(["USER", "ROLE"] if with_user else []), "NAME", "STATUS", "EXPIRES", "CREATED"]
    for column in [*columns, "CREATED BY"]:
        table.add_column(column, no_wrap=column in {"ID", "STATUS"})
    for token in tokens:
        who = [token.get("user", ""), token.get("role", "")] if with_user else []
        table.add_row(
            *cells(
                token.get("id", ""),
                *who,
                token.get("name", ""),
                token_status(token),
                format_time(token.get("expires_at")) if token.get("expires_at") else "never",
                format_time(token.get("created_at")),
                token.get("created_by") or "-",
            )
        )
    return table


def _lifetime(token: dict[str, Any]) -> str:
    return f"expires {format_time(token['expires_at'])}" if token.get("expires_at") else "never expires"


# -- mwms token ------------------------------------------------------------------------------------------


@token_app.command("create")
@handles_errors()
def create_token(
    user: Annotated[
        str, typer.Option("--user", help="Who the token belongs to; their jobs carry this name.")
    ],
    role: Annotated[
        str, typer.Option("--role", help="admin, user (submit and cancel jobs) or viewer (read only).")
    ] = "user",
    name: Annotated[
        str,
        typer.Option("--name", help="A label, e.g. the laptop or CI job that uses it; default: the user."),
    ] = "",
    expires_in: ExpiresInOption = None,
    json_output: JsonOption = False,
    api: ApiOption = None,
    token: TokenOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Create an API token and print its secret, which cannot be shown again."""
    role = role.lower()
    if role not in ROLES:
        raise CliError(f"--role {role!r} must be one of {', '.join(ROLES)}")
    seconds = parse_duration(expires_in) if expires_in else None
    with connect(api, token, ca_file) as client:
        created = client.rest.create_token(user, role, name, seconds)
    if json_output:
        print_json(created)
        return
    print(terminal_safe(created["token"]), flush=True)
    err.print(
        safe_text(
            f"created API token {created['id']} for {created['user']} (role {created['role']}, "
            f"{_lifetime(created)}). Its secret, printed on stdout, is shown only this once: hand it over "
            f"now; its user runs `mwms login --api {client.api}` or sets MWMS_TOKEN."
        )
    )


@token_app.command("list")
@handles_errors()
def list_tokens(
    json_output: JsonOption = False,
    api: ApiOption = None,
    token: TokenOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """List API tokens (never their secrets), revoked and expired ones included."""
    with connect(api, token, ca_file) as client:
        found = client.rest.list_tokens()
    if json_output:
        print_json(found)
    elif not found:
        err.print("no API tokens")
    else:
        out.print(tokens_table(found, with_user=True))


@token_app.command("revoke")
@handles_errors()
def revoke_token(
    token_id: TokenIdArgument,
    json_output: JsonOption = False,
    api: ApiOption = None,
    token: TokenOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Revoke an API token at once; dashboard sessions opened with it end too."""
    with connect(api, token, ca_file) as client:
        revoked = client.rest.revoke_token(token_id)
    if json_output:
        print_json(revoked)
        return
    out.print(
        safe_text(
            f"revoked API token {revoked['id']} ({revoked.get('name', '')}, user {revoked.get('user', '')})"
        )
    )


# -- mwms agent-token ------------------------------------------------------------------------------------


@agent_token_app.command("create")
@handles_errors()
def create_join_token(
    name: Annotated[str, typer.Option("--name", help="A label, e.g. the rack or site.")] = "agents",
    expires_in: ExpiresInOption = None,
    json_output: JsonOption = False,
    api: ApiOption = None,
    token: TokenOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Create a join token for agents and print its secret, which cannot be shown again."""
    seconds = parse_duration(expires_in) if expires_in else None
    with connect(api, token, ca_file) as client:
        created = client.rest.create_join_token(name, seconds)
    if json_output:
        print_json(created)
        return
    print(terminal_safe(created["token"]), flush=True)
    err.print(
        safe_text(
            f"created join token {created['id']} ({created.get('name', '')}, {_lifetime(created)}). "
            "Its secret, printed on stdout, is shown only this once. Give it to agents in their environment, "
            "not on their command line: MWMS_JOIN_TOKEN=... mwms agent --server HOST:GRPC_PORT "
            "(for systemd: an EnvironmentFile)."
        )
    )


@agent_token_app.command("list")
@handles_errors()
def list_join_tokens(
    json_output: JsonOption = False,
    api: ApiOption = None,
    token: TokenOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """List join tokens (never their secrets), revoked and expired ones included."""
    with connect(api, token, ca_file) as client:
        found = client.rest.list_join_tokens()
    if json_output:
        print_json(found)
    elif not found:
        err.print("no join tokens; make one with `mwms agent-token create`")
    else:
        out.print(tokens_table(found, with_user=False))


@agent_token_app.command("revoke")
@handles_errors()
def revoke_join_token(
    token_id: TokenIdArgument,
    json_output: JsonOption = False,
    api: ApiOption = None,
    token: TokenOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Revoke a join token: no new agent joins with it; to shut out a joined agent use `mwms remove-agent`."""
    with connect(api, token, ca_file) as client:
        revoked = client.rest.revoke_join_token(token_id)
    if json_output:
        print_json(revoked)
        return
    out.print(safe_text(f"revoked join token {revoked['id']} ({revoked.get('name', '')})"))


# -- mwms remove-agent -----------------------------------------------------------------------------------


def find_agent(agents: list[dict[str, Any]], wanted: str) -> dict[str, Any]:
    """The agent whose id, else whose name, is `wanted` (mwms/agent_references.py); CliError when none or
    several could be meant."""
    pairs = [(str(agent.get("id", "")), str(agent.get("name", ""))) for agent in agents]
    try:
        agent_id = resolve_agent_reference(pairs, wanted)
    except UnknownAgent as error:
        raise CliError(str(error), ExitCode.NOT_FOUND) from None
    except AmbiguousAgent as error:
        raise CliError(str(error)) from None
    return next(agent for agent in agents if agent.get("id") == agent_id)


@handles_errors()
def remove_agent(
    agent: Annotated[str, typer.Argument(help="The agent's name or id, as `mwms agents` shows them.")],
    json_output: JsonOption = False,
    api: ApiOption = None,
    token: TokenOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Remove an agent (admin): its credential is revoked and the tasks it runs are stopped.

    To let the machine join again it needs a valid join token.
    """
    with connect(api, token, ca_file) as client:
        target = find_agent(client.rest.list_agents(), agent)
        result = client.rest.remove_agent(target["id"])
    if json_output:
        print_json(result)
        return
    out.print(safe_text(f"removed agent {target.get('name', '')} ({target['id']})"))
    tasks = target.get("tasks") or []
    if tasks:
        stopped = ", ".join(
            f"{task.get('job_name') or task.get('job_id')}[{task.get('task_index')}]" for task in tasks
        )
        err.print(safe_text(f"the tasks it ran were stopped: {stopped}"))
