"""Commands for sharing the cluster: `mwms priority`, `mwms queue`, `mwms team ...`, `mwms quota ...` (those
two in mwms/cli/team_commands.py, re-exported here) and `mwms agent cordon|uncordon|drain`.

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
from mwms.cli.team_commands import TeamArgument as TeamArgument
from mwms.cli.team_commands import UserArgument as UserArgument
from mwms.cli.team_commands import add_member as add_member
from mwms.cli.team_commands import clear_quota as clear_quota
from mwms.cli.team_commands import format_amounts as format_amounts
from mwms.cli.team_commands import format_counts as format_counts
from mwms.cli.team_commands import format_standing as format_standing
from mwms.cli.team_commands import list_teams as list_teams
from mwms.cli.team_commands import print_standings as print_standings
from mwms.cli.team_commands import print_team as print_team
from mwms.cli.team_commands import quota_app as quota_app
from mwms.cli.team_commands import remove_member as remove_member
from mwms.cli.team_commands import set_quota as set_quota
from mwms.cli.team_commands import share_in_use as share_in_use
from mwms.cli.team_commands import standings_table as standings_table
from mwms.cli.team_commands import team_app as team_app
from mwms.cli.team_commands import teams_table as teams_table
from mwms.client import Agent, Client

# How often `mwms agent drain --wait` asks whether the agent still runs something.
DRAIN_POLL_S = 1.0
DEFAULT_DRAIN_TIMEOUT_S = 3600.0

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
    job = client.set_priority(job_id, parse_priority(value, "PRIORITY"))
    if json_output:
        print_json(job.raw)
        return
    out.print(
        Text.assemble("job ", safe_text(job.id), " ", state_text(job.state), f" priority {job.priority}")
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
    page = client.queue_page(offset=offset, limit=limit)
    if json_output:
        print_json(page.raw)
        return
    entries = page.entries
    if not entries:
        err.print("no job is waiting" + (f" after the first {offset}" if offset else ""))
        return
    out.print(queue_table([entry.raw for entry in entries]))
    if page.total > offset + len(entries):
        err.print(
            f"showing {offset + 1}-{offset + len(entries)} of {page.total}; see more with --offset/--limit"
        )
    print_standings(client, entries)


# -- mwms team / mwms quota -------------------------------------------------------------------------------


# -- mwms agent cordon / uncordon / drain -----------------------------------------------------------------


def print_agent(agent: Agent, json_output: bool) -> None:
    """One agent after a change: the API's object with --json, else one line of its cordon state."""
    if json_output:
        print_json(agent.raw)
        return
    out.print(Text.assemble("agent ", safe_text(agent.name), ": ", cordon_text(agent.raw)))


@with_client
def cordon(
    client: Client, agent: AgentArgument, reason: ReasonOption = "", json_output: JsonOption = False
) -> None:
    """Cordon an agent (admin): nothing new is placed on it; what it runs keeps running."""
    print_agent(client.cordon(agent, reason), json_output)


@with_client
def uncordon(client: Client, agent: AgentArgument, json_output: JsonOption = False) -> None:
    """End an agent's cordon or drain (admin): jobs may be placed on it again."""
    print_agent(client.uncordon(agent), json_output)


def running_on(agent: Agent) -> str:
    return ", ".join(
        f"{task.get('job_name') or task.get('job_id')}[{task.get('task_index')}]" for task in agent.tasks
    )


def wait_until_drained(client: Client, agent_id: str, timeout: float) -> Agent:
    """Polls the agents until `agent_id` holds no task, saying on stderr what still runs; CliError with
    exit code 1 after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    said = None
    while True:
        found = [a for a in client.agents() if a.id == agent_id]
        if not found:
            raise CliError(f"agent {agent_id} is gone (removed?) while draining", ExitCode.NOT_FOUND)
        agent = found[0]
        if not agent.tasks:
            return agent
        still = running_on(agent)
        if still != said:
            err.print(safe_text(f"waiting for {still} to stop"))
            said = still
        if time.monotonic() >= deadline:
            raise CliError(
                f"agent {agent.name} still runs {still} after {timeout:g} s; it stays draining "
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
    grace_seconds = None if grace is None else round(grace)
    drained = client.drain(agent, reason, grace_seconds=grace_seconds, let_finish=let_finish)
    if wait and drained.tasks:
        drained = wait_until_drained(client, drained.id, timeout)
    print_agent(drained, json_output)
