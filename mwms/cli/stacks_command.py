"""`mwms stacks JOB`: the Python stacks of every task of a running job, side by side with where each
worker waits (inside a TensorFlow collective or not)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from mwms.cli.connect import with_client
from mwms.cli.options import JsonOption
from mwms.cli.output import format_time, out, print_json
from mwms.cli.safe_text import safe_text
from mwms.client import Client


def snapshots_text(task: dict[str, Any]) -> str:
    """' (in 2 of 3 snapshots)', ' (outside in 3 of 3 snapshots)': what the verdict rests on; empty for a
    dump of one snapshot (or from a coordinator that does not count them)."""
    taken = task.get("snapshots") or 0
    if taken <= 1 or task["in_collective"] is None:
        return ""
    inside = task.get("snapshots_in_collective") or 0
    if task["in_collective"]:
        return f" (in {inside} of {taken} snapshots)"
    return f" (outside in {taken - inside} of {taken} snapshots)"


def collective_text(in_collective: bool | None, snapshots: str = "") -> Text:
    if in_collective is None:
        return Text("unknown", style="bright_black")
    if in_collective:
        return Text("yes" + snapshots, style="green")
    return Text("NO" + snapshots, style="bold red")


def print_stacks(dump: dict[str, Any]) -> None:
    """A header line for the dump, then per task its agent, pid, method and collective (over how many
    snapshots), then each thread's frames, innermost first (of the snapshot the coordinator shows)."""
    cause = "hang detection" if dump["cause"] == "hang" else f"requested by {dump['requested_by'] or '?'}"
    missing = "" if dump["complete"] else " (some tasks did not answer)"
    header = f"stacks {dump['id']} of job {dump['job_id']}, attempt {dump['attempt']}: {cause}, "
    out.print(safe_text(header + format_time(dump["requested_at"]) + missing))
    for task in dump["tasks"]:
        out.print()
        line = safe_text(f"worker {task['task_index']}  agent {task['agent_name'] or task['agent_id']}  ")
        line.append_text(safe_text(f"pid {task['pid'] if task['pid'] is not None else '-'}  "))
        line.append_text(safe_text(f"method {task['method'] or '-'}  in collective: "))
        line.append_text(collective_text(task["in_collective"], snapshots_text(task)))
        out.print(line)
        if task["error"]:
            out.print(safe_text(f"  {task['error']}", style="yellow"))
        for thread in task["threads"]:
            marker = "  [in collective]" if thread["in_collective"] else ""
            out.print(safe_text(f"  {thread['title']}{marker}", style="bold"))
            for frame in thread["frames"]:
                out.print(safe_text(f"    {frame}"))


@with_client
def stacks(
    client: Client,
    job_id: Annotated[str, typer.Argument(help="The job's id (as printed by `mwms submit` or `mwms jobs`).")],
    refresh: Annotated[
        bool,
        typer.Option(
            "--refresh/--no-refresh",
            help="Take the stacks now (the job must be running); --no-refresh shows the last dump taken "
            "(on request or by hang detection).",
        ),
    ] = True,
    json_output: JsonOption = False,
) -> None:
    """Show the Python stacks of every task of a job: per task its agent, pid and whether it waits in a
    TensorFlow collective (NO only when outside one in all of the 3 snapshots taken over about a second),
    then every thread's stack, innermost frame first."""
    dump = client.take_stacks(job_id) if refresh else client.stacks(job_id)
    if json_output:
        print_json(dump.raw)
    else:
        print_stacks(dump.raw)
