"""`mwms team ...` and `mwms quota ...`: teams, their members and quotas, and the teams' fair share that
`mwms queue` shows after the queue (registered by mwms/cli/main.py through mwms/cli/sharing_commands.py).

Reading the teams is for every role; changing teams and quotas is an admin's.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from mwms.cli.admin_commands import SUB_APP_SETTINGS
from mwms.cli.connect import with_client
from mwms.cli.errors import CliError
from mwms.cli.options import JsonOption
from mwms.cli.output import (
    cells,
    err,
    first_line,
    out,
    print_json,
)
from mwms.cli.safe_text import safe_text
from mwms.client import Client, QueueEntry, Team
from mwms.errors import MwmsError

team_app = typer.Typer(
    name="team",
    help="Teams: which team a user's jobs count against for fair share and quotas (changes: admin only). "
    "A user in no team is a team of their own.",
    **SUB_APP_SETTINGS,
)
quota_app = typer.Typer(
    name="quota",
    help="Team quotas: how many GPUs and CPU slots a team's running jobs may hold at once; over it they "
    "only borrow idle capacity and are preempted first (admin only).",
    **SUB_APP_SETTINGS,
)

TeamArgument = Annotated[str, typer.Argument(help="The team's name.")]
UserArgument = Annotated[str, typer.Argument(help="The user's name, as their API token names them.")]


def format_counts(counts: dict[str, Any] | None, *, caps: bool) -> str:
    """{"gpus": 4, "cpu_slots": None} -> '4 GPU, any CPU' for a quota, '4 GPU, 0 CPU' for usage."""
    if counts is None:
        return "none"

    def one(value: Any, unit: str) -> str:
        return f"{'any' if caps else 0} {unit}" if value is None else f"{value} {unit}"

    return f"{one(counts.get('gpus'), 'GPU')}, {one(counts.get('cpu_slots'), 'CPU')}"


def format_amounts(amounts: dict[str, Any] | None, unit: str = "") -> str:
    """{"gpus": 2.5, "cpu_slots": 0} -> '2.5 GPU, 0 CPU' (unit "-h": '2.5 GPU-h, 0 CPU-h'); '-' when absent
    (a coordinator from before fair share over time)."""
    if not amounts:
        return "-"
    return f"{float(amounts.get('gpus') or 0):.3g} GPU{unit}, {float(amounts.get('cpu_slots') or 0):.3g} CPU{unit}"


def format_standing(team: dict[str, Any]) -> str:
    """A team's standing: '1.25 h' (hours of its whole share its decayed usage amounts to); '-' when absent."""
    standing = team.get("standing")
    return "-" if standing is None else f"{float(standing):.3g} h"


def share_in_use(team: dict[str, Any]) -> float:
    """What it holds over its share, the larger of the two kinds (infinite: it holds a kind it has no share of)."""
    in_use, share = team.get("in_use") or {}, team.get("share") or {}
    ratio = 0.0
    for kind in ("gpus", "cpu_slots"):
        held, part = float(in_use.get(kind) or 0), float(share.get(kind) or 0)
        if held > 0:
            ratio = max(ratio, held / part if part > 0 else float("inf"))
    return ratio


def teams_table(teams: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("TEAM", "MEMBERS", "QUOTA", "IN USE", "SHARE", "RECENT USE", "STANDING"):
        table.add_column(column, no_wrap=column not in {"TEAM", "MEMBERS"})
    for team in teams:
        table.add_row(
            *cells(
                team.get("team", ""),
                ", ".join(team.get("members") or []) or "-",
                format_counts(team.get("quota"), caps=True),
                format_counts(team.get("in_use"), caps=False),
                format_amounts(team.get("share")),
                format_amounts(team.get("usage_device_hours"), "-h"),
                format_standing(team),
            )
        )
    return table


def standings_table(teams: list[dict[str, Any]]) -> Table:
    """The teams' fair share, in the order it puts them in within a priority: lowest standing plus share in
    use first."""
    table = Table(
        box=None,
        header_style="bold",
        title="fair share: within a priority, the team with the lowest STANDING + NOW goes first",
        title_justify="left",
    )
    for column in ("TEAM", "STANDING", "NOW", "IN USE", "SHARE", "RECENT USE"):
        table.add_column(column, no_wrap=column != "TEAM")
    ranked = sorted(teams, key=lambda t: (float(t.get("standing") or 0) + share_in_use(t), t.get("team", "")))
    for team in ranked:
        now = share_in_use(team)
        table.add_row(
            *cells(
                team.get("team", ""),
                format_standing(team),
                "all" if now == float("inf") else f"{now:.2f}",
                format_counts(team.get("in_use"), caps=False),
                format_amounts(team.get("share")),
                format_amounts(team.get("usage_device_hours"), "-h"),
            )
        )
    return table


def print_standings(client: Client, entries: list[QueueEntry]) -> None:
    """The fair share of the teams `entries` (queue rows) belong to, after the queue; a note on stderr when
    the teams cannot be read."""
    waiting = {entry.team for entry in entries if entry.team}
    try:
        found = client.teams()
    except MwmsError as error:
        err.print(safe_text(f"fair share not shown: the teams could not be read ({first_line(str(error))})"))
        return
    teams = [team.raw for team in found if team.name in waiting and "standing" in team.raw]
    if teams:
        out.print(standings_table(teams))


def print_team(team: Team, json_output: bool) -> None:
    """One team after a change: the API's object with --json, else one line."""
    if json_output:
        print_json(team.raw)
        return
    members = ", ".join(team.members) or "no members"
    quota = format_counts(team.quota, caps=True)
    out.print(safe_text(f"team {team.name}: {members}; quota {quota}"))


@team_app.command("list")
@with_client
def list_teams(client: Client, json_output: JsonOption = False) -> None:
    """List teams with members, a quota, jobs holding devices or recent use: members, quota, devices in use,
    share, recent use (device-hours, decayed with the coordinator's half-life) and standing (that use over
    the share, in hours of the whole share: lower goes first within a priority)."""
    found = client.teams()
    if json_output:
        print_json([team.raw for team in found])
    elif not found:
        err.print("no teams yet; every user is a team of their own until `mwms team add TEAM USER`")
    else:
        out.print(teams_table([team.raw for team in found]))


@team_app.command("add")
@with_client
def add_member(
    client: Client, team: TeamArgument, user: UserArgument, json_output: JsonOption = False
) -> None:
    """Put USER in TEAM (out of any other team); the jobs they submit from now on count against TEAM."""
    print_team(client.add_team_member(team, user), json_output)


@team_app.command("remove")
@with_client
def remove_member(
    client: Client, team: TeamArgument, user: UserArgument, json_output: JsonOption = False
) -> None:
    """Take USER out of TEAM: their new jobs are a team of their own again."""
    print_team(client.remove_team_member(team, user), json_output)


@quota_app.command("set")
@with_client
def set_quota(
    client: Client,
    team: TeamArgument,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=0, max=1_000_000, help="GPUs the team may hold; unset: any.")
    ] = None,
    cpu_slots: Annotated[
        int | None,
        typer.Option("--cpu-slots", min=0, max=1_000_000, help="CPU slots the team may hold; unset: any."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Set TEAM's quota, replacing the one it had: a kind not given has no cap."""
    if gpus is None and cpu_slots is None:
        raise CliError("give --gpus and/or --cpu-slots; to remove a team's quota use `mwms quota clear TEAM`")
    print_team(client.set_quota(team, gpus=gpus, cpu_slots=cpu_slots), json_output)


@quota_app.command("clear")
@with_client
def clear_quota(client: Client, team: TeamArgument, json_output: JsonOption = False) -> None:
    """Remove TEAM's quota: its jobs are capped by nothing but the cluster."""
    print_team(client.clear_quota(team), json_output)
