"""Commands for sharing the cluster: `mwms priority`, `mwms queue`, `mwms team ...`, `mwms quota ...` and
`mwms agent cordon|uncordon|drain`.

Reading the queue and the teams is for every role; changing teams, quotas and agents is an admin's (the
coordinator answers others with 403, exit code 5). A change prints one line on stdout saying what now
holds; --json prints the API's object instead.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from mwms.cli.admin_commands import SUB_APP_SETTINGS
from mwms.cli.connect import with_client
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser
from mwms.cli.errors import CliError, ExitCode
from mwms.cli.options import JsonOption
from mwms.cli.output import (
    cells,
    cordon_text,
    err,
    first_line,
    format_devices,
    format_duration,
    out,
    parse_time,
    print_json,
    state_text,
)
from mwms.cli.parsing import parse_priority
from mwms.cli.safe_text import safe_text
from mwms.client import Client
from mwms.errors import MwmsError

# How often `mwms agent drain --wait` asks whether the agent still runs something.
DRAIN_POLL_S = 1.0
DEFAULT_DRAIN_TIMEOUT_S = 3600.0

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
AgentArgument = Annotated[str, typer.Argument(help="The agent's name or id, as `mwms agents` shows them.")]
ReasonOption = Annotated[
    str, typer.Option("--reason", "-r", help="Why, for whoever reads `mwms agents` (at most 500 characters).")
]


# -- mwms priority ----------------------------------------------------------------------------------------


@with_client
def priority(
    client: Client,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="The job's id.")],
    value: Annotated[
        str,
        typer.Argument(
            metavar="PRIORITY",
            help="0-1000 (higher is placed first), or low (250), normal (500), high (750).",
        ),
    ],
    json_output: JsonOption = False,
) -> None:
    """Change a waiting job's priority; users may go up to the coordinator's ceiling, admins anywhere."""
    job = client.rest.set_priority(job_id, parse_priority(value, "PRIORITY"))
    if json_output:
        print_json(job)
        return
    out.print(
        Text.assemble(
            "job ",
            safe_text(job["id"]),
            " ",
            state_text(job.get("state")),
            f" priority {job.get('priority')}",
        )
    )


# -- mwms queue -------------------------------------------------------------------------------------------


def waiting_for(entry: dict[str, Any], now: datetime | None = None) -> str:
    """How long the job has waited: since it was submitted."""
    created = parse_time(entry.get("created_at"))
    if created is None:
        return "-"
    return format_duration(((now or datetime.now(timezone.utc)) - created).total_seconds())


def reason_text(waiting: dict[str, Any]) -> Text:
    """`kind: message` of a waiting reason; "-" when there is none (yet)."""
    kind, message = waiting.get("kind") or "", first_line(waiting.get("message"))
    if not kind and not message:
        return Text("-")
    return Text.assemble(safe_text(kind, "yellow"), safe_text(f": {message}" if message else ""))


# What an estimated start rests on (GET /api/v1/queue's estimate_basis), as the EST. START column says it.
ESTIMATE_BASES = {"max_runtime": "from max_runtime", "similar_jobs": "from similar jobs"}


def about(seconds: float) -> str:
    """A time to come, roughly: 'about now', 'about 12 min', 'about 2 h 15 min', 'about 3 days'."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "about now"
    if minutes < 60:
        return f"about {minutes} min"
    if minutes < 48 * 60:
        hours, rest = divmod(5 * round(minutes / 5), 60)
        return f"about {hours} h" + (f" {rest} min" if rest else "")
    return f"about {round(minutes / (24 * 60))} days"


def estimate_text(entry: dict[str, Any], now: datetime | None = None) -> str:
    """A queue row's estimated start and what it rests on: 'about 12 min, from similar jobs'; 'any time
    now' when the running jobs it waits for have run longer than their similar jobs did; 'unknown' when
    nothing tells. A coordinator without estimate_basis gives the reservation's time (max_runtime)."""
    basis = entry.get("estimate_basis")
    estimate = parse_time(
        entry.get("estimated_start") if basis else (entry.get("waiting") or {}).get("estimated_start")
    )
    if estimate is None or basis == "unknown":
        return "unknown"
    if basis == "overdue":
        return "any time now (running jobs overdue)"
    wait = (estimate - (now or datetime.now(timezone.utc))).total_seconds()
    return f"{about(wait)}, {ESTIMATE_BASES.get(basis or 'max_runtime', 'estimated')}"


def queue_table(entries: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    columns = ("POS", "JOB", "NAME", "TEAM", "USER", "PRIORITY", "WORKERS", "STATE", "WAITING", "REASON")
    for column in (*columns, "EST. START"):
        table.add_column(column, no_wrap=column not in {"NAME", "REASON"})
    for entry in entries:
        waiting = entry.get("waiting") or {}
        table.add_row(
            *cells(
                entry.get("position", "-"),
                entry.get("job_id", ""),
                entry.get("name", ""),
                entry.get("team") or "-",
                entry.get("submitted_by") or "-",
                entry.get("priority", "-"),
                format_devices(entry),
                state_text(entry.get("state")),
                waiting_for(entry),
                reason_text(waiting),
                estimate_text(entry),
            )
        )
    return table


@with_client
def queue(
    client: Client,
    limit: Annotated[
        int, typer.Option(min=1, max=500, help="How many waiting jobs to show, first first.")
    ] = 100,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many of the first waiting jobs.")] = 0,
    json_output: JsonOption = False,
) -> None:
    """List the waiting jobs in the order the scheduler places them, with why each waits and when it is
    estimated to start: from running jobs' max_runtime, else from how long the same user's jobs of the same
    shape usually ran ('unknown' when neither tells)."""
    page = client.rest.queue(offset=offset, limit=limit)
    if json_output:
        print_json(page)
        return
    entries = page.get("jobs") or []
    if not entries:
        err.print("no job is waiting" + (f" after the first {offset}" if offset else ""))
        return
    out.print(queue_table(entries))
    total = page.get("total", len(entries))
    if total > offset + len(entries):
        err.print(f"showing {offset + 1}-{offset + len(entries)} of {total}; see more with --offset/--limit")
    print_standings(client, entries)


# -- mwms team / mwms quota -------------------------------------------------------------------------------


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


def print_standings(client: Client, entries: list[dict[str, Any]]) -> None:
    """The fair share of the teams `entries` (queue rows) belong to, after the queue; a note on stderr when
    the teams cannot be read."""
    waiting = {entry.get("team") for entry in entries if entry.get("team")}
    try:
        found = client.rest.list_teams()
    except MwmsError as error:
        err.print(safe_text(f"fair share not shown: the teams could not be read ({first_line(str(error))})"))
        return
    teams = [team for team in found if team.get("team") in waiting and "standing" in team]
    if teams:
        out.print(standings_table(teams))


def print_team(team: dict[str, Any], json_output: bool) -> None:
    """One team after a change: the API's object with --json, else one line."""
    if json_output:
        print_json(team)
        return
    members = ", ".join(team.get("members") or []) or "no members"
    quota = format_counts(team.get("quota"), caps=True)
    out.print(safe_text(f"team {team.get('team', '')}: {members}; quota {quota}"))


@team_app.command("list")
@with_client
def list_teams(client: Client, json_output: JsonOption = False) -> None:
    """List teams with members, a quota, jobs holding devices or recent use: members, quota, devices in use,
    share, recent use (device-hours, decayed with the coordinator's half-life) and standing (that use over
    the share, in hours of the whole share: lower goes first within a priority)."""
    found = client.rest.list_teams()
    if json_output:
        print_json(found)
    elif not found:
        err.print("no teams yet; every user is a team of their own until `mwms team add TEAM USER`")
    else:
        out.print(teams_table(found))


@team_app.command("add")
@with_client
def add_member(
    client: Client, team: TeamArgument, user: UserArgument, json_output: JsonOption = False
) -> None:
    """Put USER in TEAM (out of any other team); the jobs they submit from now on count against TEAM."""
    print_team(client.rest.add_team_member(team, user), json_output)


@team_app.command("remove")
@with_client
def remove_member(
    client: Client, team: TeamArgument, user: UserArgument, json_output: JsonOption = False
) -> None:
    """Take USER out of TEAM: their new jobs are a team of their own again."""
    print_team(client.rest.remove_team_member(team, user), json_output)


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
    print_team(client.rest.set_quota(team, gpus, cpu_slots), json_output)


@quota_app.command("clear")
@with_client
def clear_quota(client: Client, team: TeamArgument, json_output: JsonOption = False) -> None:
    """Remove TEAM's quota: its jobs are capped by nothing but the cluster."""
    print_team(client.rest.clear_quota(team), json_output)


# -- mwms agent cordon / uncordon / drain -----------------------------------------------------------------


def print_agent(agent: dict[str, Any], json_output: bool) -> None:
    """One agent after a change: the API's object with --json, else one line of its cordon state."""
    if json_output:
        print_json(agent)
        return
    out.print(Text.assemble("agent ", safe_text(agent.get("name", "")), ": ", cordon_text(agent)))


@with_client
def cordon(
    client: Client, agent: AgentArgument, reason: ReasonOption = "", json_output: JsonOption = False
) -> None:
    """Cordon an agent (admin): nothing new is placed on it; what it runs keeps running."""
    print_agent(client.rest.cordon_agent(agent, reason), json_output)


@with_client
def uncordon(client: Client, agent: AgentArgument, json_output: JsonOption = False) -> None:
    """End an agent's cordon or drain (admin): jobs may be placed on it again."""
    print_agent(client.rest.uncordon_agent(agent), json_output)


def running_on(agent: dict[str, Any]) -> str:
    return ", ".join(
        f"{task.get('job_name') or task.get('job_id')}[{task.get('task_index')}]"
        for task in agent.get("tasks") or []
    )


def wait_until_drained(client: Client, agent_id: str, timeout: float) -> dict[str, Any]:
    """Polls the agents until `agent_id` holds no task, saying on stderr what still runs; CliError with
    exit code 1 after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    said = None
    while True:
        found = [a for a in client.rest.list_agents() if a.get("id") == agent_id]
        if not found:
            raise CliError(f"agent {agent_id} is gone (removed?) while draining", ExitCode.NOT_FOUND)
        agent = found[0]
        if not agent.get("tasks"):
            return agent
        still = running_on(agent)
        if still != said:
            err.print(safe_text(f"waiting for {still} to stop"))
            said = still
        if time.monotonic() >= deadline:
            raise CliError(
                f"agent {agent.get('name', agent_id)} still runs {still} after {timeout:g} s; it stays draining "
                "(run `mwms agent drain` again with --wait, or check `mwms agents`)",
                ExitCode.WAIT_TIMED_OUT,
            )
        time.sleep(DRAIN_POLL_S)


@with_client
def drain(
    client: Client,
    agent: AgentArgument,
    reason: ReasonOption = "",
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            parser=duration_option_parser(allow_zero=True, maximum=3600),
            metavar=DURATION_METAVAR,
            help="Time, e.g. 30s (at most 1h), between SIGTERM and SIGKILL for the preempted workers to save; default: each job's "
            "--preemption-grace, else the coordinator's MWMS_PREEMPTION_GRACE_S.",
            show_default=False,
        ),
    ] = None,
    let_finish: Annotated[
        bool,
        typer.Option("--let-finish", help="Preempt nothing: let the jobs it runs finish, place none new."),
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until no task runs on it any more, then exit 0.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            parser=duration_option_parser(allow_zero=True),
            metavar=DURATION_METAVAR,
            help="With --wait: give up (exit code 1) after this long, e.g. 10m.",
        ),
    ] = DEFAULT_DRAIN_TIMEOUT_S,
    json_output: JsonOption = False,
) -> None:
    """Drain an agent (admin): cordon it and preempt the jobs it runs, which then wait for other agents.

    Each job's workers get SIGTERM, the grace to save a checkpoint, then SIGKILL; the job waits again in
    its place in the queue, no restart used. `mwms agent uncordon` ends the drain.
    """
    drained = client.rest.drain_agent(agent, reason, None if grace is None else round(grace), let_finish)
    if wait and drained.get("tasks"):
        drained = wait_until_drained(client, str(drained["id"]), timeout)
    print_agent(drained, json_output)
