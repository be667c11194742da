"""Commands that read or change jobs and agents through the API: jobs, agents, status, logs, cancel,
metrics, artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from mwms.cli.attempt_stories import print_attempt_stories
from mwms.cli.connect import with_client
from mwms.cli.errors import CliError
from mwms.cli.log_printer import LogPrinter
from mwms.cli.options import JsonOption
from mwms.cli.output import (
    agents_table,
    artifacts_table,
    err,
    jobs_table,
    metrics_table,
    out,
    print_job,
    print_json,
    state_text,
)
from mwms.cli.safe_text import safe_text, terminal_safe
from mwms.client import Artifact, Client, Job
from mwms.client.packing import human_size

# The API answers with this many of the newest lines when not told --tail.
DEFAULT_LOG_TAIL = 1000

JOB_STATES = (
    "PENDING",
    "SCHEDULED",
    "RUNNING",
    "RESTARTING",
    "PREEMPTING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
)

JobArgument = Annotated[
    str, typer.Argument(help="The job's id (as printed by `mwms submit` or `mwms jobs`).")
]


@with_client
def jobs(
    client: Client,
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Only jobs in this state; repeatable.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="How many jobs to show, newest first.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many of the newest jobs.")] = 0,
    json_output: JsonOption = False,
) -> None:
    """List jobs, newest first."""
    states = [value.upper() for value in state or []]
    unknown = [value for value in states if value not in JOB_STATES]
    if unknown:
        raise CliError(f"unknown state {', '.join(unknown)}; use one of {', '.join(JOB_STATES)}")
    page = client.job_page(states, offset=offset, limit=limit)
    if json_output:
        print_json(page.raw)
        return
    if not page.jobs:
        where = f" in state {', '.join(states)}" if states else ""
        total = page.total
        err.print(
            f"no jobs{where}" + (f" after the first {offset} (there are {total})" if offset and total else "")
        )
        return
    out.print(jobs_table([job.raw for job in page.jobs]))
    shown = len(page.jobs)
    if page.total > offset + shown:
        err.print(f"showing {offset + 1}-{offset + shown} of {page.total}; see more with --offset/--limit")


@with_client
def agents(
    client: Client,
    json_output: JsonOption = False,
) -> None:
    """List the agents the coordinator knows, their devices and running tasks."""
    found = [agent.raw for agent in client.agents()]
    if json_output:
        print_json(found)
        return
    if not found:
        err.print("no agents have joined; start one with `mwms agent --server HOST:GRPC_PORT`")
        return
    out.print(agents_table(found))


@with_client
def status(
    client: Client,
    job_id: JobArgument,
    json_output: JsonOption = False,
) -> None:
    """Show one job: its settings, the newest attempt's tasks, its state changes, and each attempt's
    story (why it ended, what acted on it, after how long)."""
    job = client.job(job_id).raw
    if json_output:
        print_json(job)
    else:
        print_job(job)
        print_attempt_stories(job)


@with_client
def logs(
    client: Client,
    job_id: JobArgument,
    task: Annotated[int | None, typer.Option("--task", "-t", min=0, help="Only this task's lines.")] = None,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="Lines of this attempt (default: as the API picks).")
    ] = None,
    tail: Annotated[
        int | None, typer.Option(min=1, max=10000, help="Only the last N lines (default: the API's, 1000).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
    ] = False,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Write the lines exactly as the job printed them, escape sequences and control characters "
            "included, unstyled (a plain `[task I] ` prefix unless --task is given): for pipes and files. "
            "Without it they are made safe for a terminal (escape sequences and controls but tab removed), "
            "on a terminal or not.",
        ),
    ] = False,
) -> None:
    """Print a job's log lines: `[task I] text`, or the bare text when --task is given.

    A line the job redraws (a carriage return, as a progress bar does) prints as it stands; with --follow
    on a terminal it moves in place, to a pipe or with --raw each newer state (about one a second) is a
    line of its own.
    """
    prefix = task is None
    printer = LogPrinter(out, prefix=prefix, raw=raw)
    show = printer.show

    if follow:
        # Job.logs reconnects from the last line it saw if the coordinator restarts meanwhile.
        for line in Job(client, {"id": job_id}).logs(task, follow=True, attempt=attempt, tail=tail):
            show(line.raw)
        return
    lines = client.log_page(job_id, task=task, attempt=attempt, tail=tail).lines
    for line in lines:
        show(line.raw)
    if tail is None and len(lines) >= DEFAULT_LOG_TAIL:
        err.print(f"showing the last {len(lines)} lines; ask for more with --tail N")


@with_client
def cancel(
    client: Client,
    job_id: JobArgument,
    json_output: JsonOption = False,
) -> None:
    """Cancel a job: its tasks are stopped (SIGTERM, then SIGKILL)."""
    job = client.cancel(job_id)
    if json_output:
        print_json(job.raw)
        return
    out.print(Text.assemble("job ", safe_text(job.id), " ", state_text(job.state)))


@with_client
def metrics(
    client: Client,
    job_id: JobArgument,
    name: Annotated[str | None, typer.Option(help="Only this metric (e.g. loss).")] = None,
    min_step: Annotated[int | None, typer.Option(help="Only steps >= this.")] = None,
    max_step: Annotated[int | None, typer.Option(help="Only steps <= this.")] = None,
    attempt: Annotated[int | None, typer.Option(min=1, help="Only this attempt's points.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Show the metrics a job reported: one row per step, one column per metric; per-epoch series
    (epoch_*, as fit's epoch logs are recorded) in a table of their own, one row per epoch."""
    points = client.metrics(job_id, name, min_step=min_step, max_step=max_step, attempt=attempt)
    if json_output:
        print_json({"points": [point.raw for point in points]})
        return
    if not points and name:
        names = client.metrics(job_id, attempt=attempt).names()
        if names:
            reported = terminal_safe(", ".join(names))
            err.print(f"no points for metric {name!r} in that range; this job reported: {reported}")
            return
    if not points:
        err.print(
            "no metrics reported (yet); programs report them with mwms_runtime.report() or its Keras callback"
        )
        return
    per_step = [point.raw for point in points.per_step()]
    per_epoch = [point.raw for point in points.per_epoch()]
    if per_step:
        out.print(metrics_table(per_step))
    if per_epoch:
        if per_step:
            out.print()
            out.print("per epoch (epoch index from 0, as Keras counts):")
        out.print(metrics_table(per_epoch, index_label="EPOCH"))


@with_client
def artifacts(
    client: Client,
    job_id: JobArgument,
    download: Annotated[
        Path | None, typer.Option(help="Download every artifact into this directory, keeping relative paths.")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """List the files a job saved (models, checkpoints); --download fetches them."""
    found = client.artifacts(job_id)
    if download is not None:
        download_artifacts(client, job_id, found, download)
    if json_output:
        print_json([artifact.raw for artifact in found])
    elif not found:
        err.print(
            "no artifacts; the chief's files in MWMS_OUTPUT_DIR (mwms_runtime.output_dir()) become artifacts"
        )
    elif download is None:
        out.print(artifacts_table([artifact.raw for artifact in found]))


def download_artifacts(client: Client, job_id: str, found: list[Artifact], destination: Path) -> int:
    """Downloads every listed artifact under `destination`; returns the total byte count."""
    try:
        written = Job(client, {"id": job_id}).download(destination, found)
    except OSError as error:
        raise CliError(f"cannot write {error.filename or destination}: {error.strerror or error}") from None
    total = sum(path.stat().st_size for path in written)
    err.print(f"downloaded {len(written)} files ({human_size(total)}) to {destination}")
    return total
