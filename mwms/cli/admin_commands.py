"""Admin commands: `mwms token ...` (API tokens), `mwms agent-token ...` (join tokens), `mwms remove-agent`.

A token's secret is printed once, by `create`, alone on stdout so that `T=$(mwms token create ...)` works;
the notes about it go to stderr. Listings never contain secrets: the API does not keep them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from mwms.agent_references import AmbiguousAgent, UnknownAgent, resolve_agent_reference
from mwms.cli.connect import with_client
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser
from mwms.cli.errors import CliError, ExitCode
from mwms.cli.options import JsonOption
from mwms.cli.output import cells, err, format_time, out, parse_time, print_json
from mwms.cli.safe_text import safe_text, terminal_safe
from mwms.client import Client, Token

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
    float | None,
    typer.Option(
        "--expires-in",
        parser=duration_option_parser(),
        metavar=DURATION_METAVAR,
        help="Lifetime with its unit, e.g. 30d, 12h, 90m, 2w; default: never expires.",
        show_default=False,
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


# -- create: the two differ in what a token is for and what its secret opens --------------------------


@token_app.command("create")
@with_client
def create_token(
    client: Client,
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
) -> None:
    """Create an API token and print its secret, which cannot be shown again."""
    role = role.lower()
    if role not in ROLES:
        raise CliError(f"--role {role!r} must be one of {', '.join(ROLES)}")
    seconds = None if expires_in is None else max(1, round(expires_in))
    created = client.create_token(user, role, name, expires_in_seconds=seconds)
    if json_output:
        print_json(created.raw)
        return
    print(terminal_safe(created.raw["token"]), flush=True)
    err.print(
        safe_text(
            f"created API token {created.id} for {created.user} (role {created.role}, "
            f"{_lifetime(created.raw)}). Its secret, printed on stdout, is shown only this once: hand it over "
            f"now; its user runs `mwms login --api {client.api}` or sets MWMS_TOKEN."
        )
    )


@agent_token_app.command("create")
@with_client
def create_join_token(
    client: Client,
    name: Annotated[str, typer.Option("--name", help="A label, e.g. the rack or site.")] = "agents",
    expires_in: ExpiresInOption = None,
    json_output: JsonOption = False,
) -> None:
    """Create a join token for agents and print its secret, which cannot be shown again."""
    seconds = None if expires_in is None else max(1, round(expires_in))
    created = client.create_join_token(name, expires_in_seconds=seconds)
    if json_output:
        print_json(created.raw)
        return
    print(terminal_safe(created.raw["token"]), flush=True)
    err.print(
        safe_text(
            f"created join token {created.id} ({created.name}, {_lifetime(created.raw)}). "
            "Its secret, printed on stdout, is shown only this once. Give it to agents in their environment, "
            "not on their command line: MWMS_JOIN_TOKEN=... mwms agent --server HOST:GRPC_PORT "
            "(for systemd: an EnvironmentFile)."
        )
    )


# -- list and revoke: one implementation for both kinds ---------------------------------------------------


@dataclass(frozen=True)
class TokenKind:
    """What tells `mwms token list/revoke` (API tokens) from `mwms agent-token list/revoke` (join tokens)."""

    app: typer.Typer
    noun: str  # as messages name one: "API token", "join token"
    with_user: bool  # API tokens belong to a user (with a role); join tokens to no one
    list_all: Callable[[Client], list[Token]]
    revoke: Callable[[Client, str], Token]
    none_found: str
    list_help: str
    revoke_help: str


API_TOKENS = TokenKind(
    app=token_app,
    noun="API token",
    with_user=True,
    list_all=Client.tokens,
    revoke=Client.revoke_token,
    none_found="no API tokens",
    list_help="List API tokens (never their secrets), revoked and expired ones included.",
    revoke_help="Revoke an API token at once; dashboard sessions opened with it end too.",
)
JOIN_TOKENS = TokenKind(
    app=agent_token_app,
    noun="join token",
    with_user=False,
    list_all=Client.join_tokens,
    revoke=Client.revoke_join_token,
    none_found="no join tokens; make one with `mwms agent-token create`",
    list_help="List join tokens (never their secrets), revoked and expired ones included.",
    revoke_help="Revoke a join token: no new agent joins with it; to shut out a joined agent use "
    "`mwms remove-agent`.",
)


def add_list_and_revoke(kind: TokenKind) -> None:
    """Adds `list` and `revoke` to the kind's command group."""

    @kind.app.command("list", help=kind.list_help)
    @with_client
    def list_command(client: Client, json_output: JsonOption = False) -> None:
        found = [token.raw for token in kind.list_all(client)]
        if json_output:
            print_json(found)
        elif not found:
            err.print(kind.none_found)
        else:
            out.print(tokens_table(found, with_user=kind.with_user))

    @kind.app.command("revoke", help=kind.revoke_help)
    @with_client
    def revoke_command(client: Client, token_id: TokenIdArgument, json_output: JsonOption = False) -> None:
        revoked = kind.revoke(client, token_id)
        if json_output:
            print_json(revoked.raw)
            return
        owner = f", user {revoked.user}" if kind.with_user else ""
        out.print(safe_text(f"revoked {kind.noun} {revoked.id} ({revoked.name}{owner})"))


add_list_and_revoke(API_TOKENS)
add_list_and_revoke(JOIN_TOKENS)


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


@with_client
def remove_agent(
    client: Client,
    agent: Annotated[str, typer.Argument(help="The agent's name or id, as `mwms agents` shows them.")],
    json_output: JsonOption = False,
) -> None:
    """Remove an agent (admin): its credential is revoked and the tasks it runs are stopped.

    To let the machine join again it needs a valid join token.
    """
    target = find_agent([found.raw for found in client.agents()], agent)
    removed = client.remove_agent(target["id"])
    if json_output:
        print_json(removed.raw)
        return
    out.print(safe_text(f"removed agent {target.get('name', '')} ({target['id']})"))
    tasks = target.get("tasks") or []
    if tasks:
        stopped = ", ".join(
            f"{task.get('job_name') or task.get('job_id')}[{task.get('task_index')}]" for task in tasks
        )
        err.print(safe_text(f"the tasks it ran were stopped: {stopped}"))
