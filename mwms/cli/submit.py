"""`mwms submit`: pack a directory, upload it, create the job, and optionally follow it to its end."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.text import Text
from typer.core import TyperCommand

from mwms.cli.connect import with_client
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser
from mwms.cli.errors import CliError, ExitCode
from mwms.cli.follow import first_failed_task, running_tasks, tail_of_task_logs, watch_job
from mwms.cli.option_slips import close_options, unknown_option_message
from mwms.cli.options import JsonOption
from mwms.cli.output import (
    clear_status_line,
    err,
    first_line,
    format_loss,
    log_line_text,
    out,
    print_json,
    state_text,
)
from mwms.cli.parsing import check_command_words, corrected_submit_line, parse_env, parse_priority
from mwms.cli.safe_text import safe_text, terminal_safe
from mwms.client import Client
from mwms.client.environment import environment_file_in
from mwms.client.environment import resolve as resolve_environment
from mwms.client.job_spec import build_job_spec
from mwms.client.packing import PackedBundle, human_size, pack_directory
from mwms.environment_lock import distinct_count, pinned_packages
from mwms.sizes import SizeError, parse_size

# Below this size an upload is over before a progress bar could tell anyone anything.
PROGRESS_BAR_MIN_BYTES = 4 * 1024 * 1024


# Click's UsageError, whichever click typer uses (its own copy from typer 0.22 on, the click package before).
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class SubmitCommand(TyperCommand):
    """`mwms submit`, which answers an option of the program given without `--` with the corrected line."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except _UsageError as error:
            if type(error).__name__ != "NoSuchOption":
                raise
            options = [
                (
                    [*p.opts, *p.secondary_opts],
                    not (getattr(p, "is_flag", False) or getattr(p, "count", False)),
                )
                for p in self.params
                if p.param_type_name == "option"
            ]
            typed = str(getattr(error, "option_name", ""))
            matches = close_options(typed, self, ctx)
            if matches and "--" in given:
                # The program is already after `--`: this is a slip in one of submit's own options.
                raise _UsageError(unknown_option_message(typed, "mwms submit", matches), ctx) from None
            corrected = corrected_submit_line(given, options)
            example = (
                shlex.join(["mwms", "submit", *corrected])
                if corrected is not None
                else "mwms submit . --workers 2 -- python train.py --epochs 1"
            )
            if matches:
                raise _UsageError(
                    f"{unknown_option_message(typed, 'mwms submit', matches)} If it is the program's, it goes "
                    f"after --, e.g.\n  {example}",
                    ctx,
                ) from None
            raise _UsageError(
                f"{typed} is not an option of mwms submit: options for the program go after --, e.g.\n  {example}",
                ctx,
            ) from None


def submit_environment(
    directory: Path, requirements: Path | None, python: str | None, *, quiet: bool, isolated: bool = False
) -> dict[str, Any] | None:
    """The job's own environment, resolved before anything is uploaded; without --requirements, a hint
    when DIR holds a file that could name one (the job then runs in the agents' environment)."""
    if requirements is None:
        if python is not None:
            raise CliError("--python is the version of the job's own environment: give --requirements too")
        if isolated:
            raise CliError("--isolated-env is about the job's own environment: give --requirements too")
        found = environment_file_in(directory)
        if found is not None and found.name != "pyproject.toml" and not quiet:
            err.print(
                f"{found.name} in {directory} is not used: the job runs in the agents' environment; "
                f"to give it its own, submit with --requirements {found.name}"
            )
        return None
    if not quiet:
        err.print(f"resolving {requirements} with uv ...")
    environment = resolve_environment(directory, requirements, python, isolated=isolated)
    if not quiet:
        count = distinct_count(pinned_packages(environment["locked"]))
        base = "alone (isolated)" if isolated else "over the agents' runtime (TensorFlow, tf-keras, numpy)"
        err.print(
            f"resolved {count} package{'s' if count != 1 else ''}, to install {base}; each agent builds "
            "them once and caches them"
        )
    return environment


def parse_memory_option(text: str | None, option: str = "--memory-per-worker") -> int | None:
    """--memory-per-worker 8G -> 8589934592 (binary units); CliError saying how to write one."""
    if text is None:
        return None
    try:
        return parse_size(text, option)
    except SizeError as error:
        raise CliError(str(error)) from None


def upload(client: Client, bundle: PackedBundle, *, show_progress: bool) -> dict[str, Any]:
    """Uploads a packed bundle, with a progress bar on stderr for big ones."""
    if not show_progress or bundle.size < PROGRESS_BAR_MIN_BYTES:
        return client.rest.upload_bundle(bundle.file)
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("uploading", total=bundle.size)
        return client.rest.upload_bundle(bundle.file, on_bytes=lambda count: progress.advance(task, count))


def pack_and_upload(client: Client, directory: Path, *, quiet: bool = False) -> str:
    """Packs `directory`, uploads it, and returns the bundle digest."""
    bundle = pack_directory(directory)
    try:
        if not quiet:
            err.print(f"packed {bundle.file_count} files from {directory} ({human_size(bundle.size)})")
        result = upload(client, bundle, show_progress=not quiet and err.is_terminal)
    finally:
        bundle.close()
    return str(result["digest"])


class TextFollower:
    """Shows a followed job: state changes and the chief's log on the consoles, a live step/loss line."""

    def __init__(self, logs_to_stdout: bool) -> None:
        self._state: str | None = None
        self._logs_console = out if logs_to_stdout else err
        self._live = (
            # No redirection of sys.stdout into the status console: the program's output stays on stdout.
            Live(
                Text(""),
                console=err,
                transient=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            if err.is_terminal
            else None
        )

    def __enter__(self) -> TextFollower:
        if self._live:
            self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._live:
            self._live.stop()

    @property
    def state(self) -> str | None:
        """The job's state as last seen (None before the first answer)."""
        return self._state

    def on_job(self, job: dict[str, Any]) -> None:
        state = job.get("state")
        if state != self._state:
            line = Text.assemble("job ", safe_text(job["id"], "bold"), " ", state_text(state))
            if job.get("reason") and state != "RUNNING":
                line.append(f": {first_line(job['reason'])}")
            err.print(line)
            self._state = state
        progress = (job.get("step"), job.get("loss"))
        if self._live and progress != (None, None):
            step = "-" if progress[0] is None else progress[0]
            status = f"{state} · attempt {job.get('attempts', '-')} · step {step} · loss {format_loss(progress[1])}"
            self._live.update(safe_text(status, style="bold"), refresh=True)

    def on_log_lines(self, lines: list[dict[str, Any]]) -> None:
        # The status line is on stderr and the log on stdout: rich cannot move one above the other, so the
        # status is taken off the screen first and drawn again under the new lines.
        clearing = self._live is not None and self._logs_console is out
        if clearing:
            clear_status_line(err.file)
        for line in lines:
            self._logs_console.print(log_line_text(line, prefix=False))
        if clearing and self._live is not None:
            sys.stdout.flush()
            self._live.refresh()


# States in which a job has no running program: Ctrl-C leaves it waiting in the queue, not running.
WAITING_STATES = frozenset({None, "PENDING"})


def stopped_following_message(job_id: str, state: str | None) -> str:
    """What Ctrl-C while following leaves behind, said as it is: a waiting job stays queued, a placed one
    keeps running; both with how to watch and how to cancel."""
    if state in WAITING_STATES:
        doing = f"job {job_id} stays queued ({state or 'not yet placed'})"
    else:
        doing = f"job {job_id} keeps running ({state})"
    return f"stopped following; {doing}: watch it with mwms logs {job_id} --follow, cancel it with mwms cancel {job_id}"


def follow_to_end(client: Client, job_id: str, *, logs_to_stdout: bool) -> dict[str, Any]:
    """Follows the job until it ends, explaining how to keep watching when interrupted."""
    follower = TextFollower(logs_to_stdout)
    try:
        with follower:
            return watch_job(client, job_id, on_job=follower.on_job, on_log_lines=follower.on_log_lines)
    except KeyboardInterrupt:
        raise CliError(stopped_following_message(job_id, follower.state), ExitCode.INTERRUPTED) from None


def report_ending(client: Client, job: dict[str, Any]) -> None:
    """On stderr: how the job ended and, if it failed, the end of the likeliest culprit's log."""
    state = job.get("state")
    line = Text.assemble("job ", safe_text(job["id"], "bold"), " ended ", state_text(state))
    if job.get("step") is not None:
        line.append_text(safe_text(f" at step {job['step']}, loss {format_loss(job.get('loss'))}"))
    err.print(line)
    for task in running_tasks(job):
        err.print(
            safe_text(
                f"task {task.get('index')} on agent {task.get('agent_name') or '-'} is still "
                f"{task.get('state')}: its end was not reported in time (see mwms status {job['id']})"
            )
        )
    if state == "SUCCEEDED":
        return
    if job.get("reason"):
        err.print(safe_text(f"reason: {job['reason']}"))
    culprit = first_failed_task(job)
    if culprit is not None and culprit.get("index", 0) != 0:
        lines = tail_of_task_logs(client, job["id"], culprit["index"], culprit.get("attempt"), 20)
        if lines:
            err.print(safe_text(f"last {len(lines)} log lines of task {culprit['index']}:", "bold"))
            for text in lines:
                err.print(safe_text(text))


@with_client
def submit(
    client: Client,
    directory: Annotated[
        Path,
        typer.Argument(metavar="DIR", help="Directory with the training program; it is packed and uploaded."),
    ],
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="COMMAND...", help="The command each worker runs in the bundle's directory (after --)."
        ),
    ],
    workers: Annotated[int, typer.Option("--workers", "-n", min=1, help="Number of workers (tasks).")],
    gpus_per_worker: Annotated[
        int | None, typer.Option("--gpus-per-worker", min=0, help="GPUs per worker; 0 runs on CPU slots.")
    ] = None,
    memory_per_worker: Annotated[
        str | None,
        typer.Option(
            "--memory-per-worker",
            metavar="SIZE",
            help="Memory each worker may use, e.g. 8G or 512M (binary units): past it the agent kills the "
            "worker (out of memory), and placement counts it against each agent's memory [default: the "
            "agent's share for tasks].",
            show_default=False,
        ),
    ] = None,
    cpus_per_worker: Annotated[
        float | None,
        typer.Option(
            "--cpus-per-worker",
            metavar="N",
            help="CPUs each worker may use at most, e.g. 4 or 0.5 (a cap, not a reservation) [default: no cap].",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name; default: the directory's name.")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="NAME=VALUE for the workers' environment; repeatable."),
    ] = None,
    communication: Annotated[
        str | None,
        typer.Option(help="Collective implementation: AUTO, RING or NCCL.", case_sensitive=False),
    ] = None,
    collective_timeout: Annotated[
        float | None,
        typer.Option(
            parser=duration_option_parser(allow_zero=True),
            metavar=DURATION_METAVAR,
            help="Timeout of each collective, e.g. 10m.",
        ),
    ] = None,
    bytes_per_pack: Annotated[int | None, typer.Option(help="Collective bytes per pack.", min=0)] = None,
    max_restarts: Annotated[
        int | None, typer.Option(help="How often a failed job is restarted.", min=0)
    ] = None,
    restart_on: Annotated[
        str | None, typer.Option(help="'retryable' (signals, lost agents) or 'any' non-zero exit.")
    ] = None,
    fail_on_nan: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on-nan",
            metavar="NAME",
            help="Fail the job at once, without a restart, when metric NAME is reported as NaN (restart.fail_on_nan); repeatable.",
        ),
    ] = None,
    startup_timeout: Annotated[
        float | None,
        typer.Option(
            parser=duration_option_parser(allow_zero=True),
            metavar=DURATION_METAVAR,
            help="How long all workers may take to start running, e.g. 5m.",
        ),
    ] = None,
    max_runtime: Annotated[
        float | None,
        typer.Option(
            parser=duration_option_parser(allow_zero=True),
            metavar=DURATION_METAVAR,
            help="How long the job may run before it is failed, e.g. 12h.",
        ),
    ] = None,
    hang_timeout: Annotated[
        float | None,
        typer.Option(
            parser=duration_option_parser(allow_zero=True),
            metavar=DURATION_METAVAR,
            help="How long without a metric point or log line, e.g. 10m, after which a RUNNING job counts "
            "as hung: its stacks are dumped and it is restarted (0: off).",
        ),
    ] = None,
    preflight: Annotated[
        bool | None,
        typer.Option(
            "--preflight/--no-preflight",
            help="Check that the workers reach each other and measure all-reduce bandwidth before the program.",
        ),
    ] = None,
    agents: Annotated[
        str | None,
        typer.Option(
            "--agents",
            help="Comma-separated agent names (or ids), one per worker: worker i runs on the i-th.",
        ),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            help="0-1000, higher is placed first (and may preempt lower ones), or low (250), normal (500), "
            "high (750); users may give up to the coordinator's MWMS_USER_PRIORITY_CEILING [default: normal].",
            show_default=False,
        ),
    ] = None,
    preemptible: Annotated[
        bool | None,
        typer.Option(
            "--preemptible/--no-preemptible",
            help="--no-preemptible: never preempt this job (it then never borrows idle capacity over its "
            "team's quota) [default: preemptible].",
            show_default=False,
        ),
    ] = None,
    preemption_grace: Annotated[
        float | None,
        typer.Option(
            "--preemption-grace",
            parser=duration_option_parser(allow_zero=True, maximum=3600),
            metavar=DURATION_METAVAR,
            help="Time, e.g. 30s (at most 1h), between the SIGTERM that preempts the workers and the SIGKILL, to save a checkpoint "
            "[default: the coordinator's MWMS_PREEMPTION_GRACE_S].",
            show_default=False,
        ),
    ] = None,
    requirements: Annotated[
        Path | None,
        typer.Option(
            "--requirements",
            "-r",
            help="A requirements.txt, pyproject.toml or uv.lock (relative to DIR): the job runs in a Python "
            "environment of its own, resolved here once with uv and built on each agent, cached by hash. "
            "It extends the agents' runtime: TensorFlow, tf-keras and numpy stay importable, and the "
            "file's pins take precedence [default: the agents' own environment].",
            show_default=False,
        ),
    ] = None,
    isolated_env: Annotated[
        bool,
        typer.Option(
            "--isolated-env",
            help="With --requirements: the environment holds those packages alone (and mwms_runtime), "
            "not the agents' TensorFlow; pin tensorflow and tf-keras in the file yourself.",
        ),
    ] = False,
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            help="The Python version of the job's own environment, e.g. 3.11 (with --requirements) "
            "[default: the agents' interpreter].",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the job to its end; exit 0 only if it SUCCEEDED.")
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Pack DIR, upload it and start a job: mwms submit DIR --workers 2 -- python train.py --epochs 3.

    Prints the job id as the first line of stdout (with --json: the job object instead).
    With --wait, the chief's log follows on stdout and state changes on stderr.
    """
    if communication is not None:
        communication = communication.upper()
        if communication not in {"AUTO", "RING", "NCCL"}:
            raise CliError(f"--communication {communication!r} must be AUTO, RING or NCCL")
    if restart_on is not None:
        restart_on = restart_on.lower()
        if restart_on not in {"retryable", "any"}:
            raise CliError(f"--restart-on {restart_on!r} must be 'retryable' or 'any'")
    if not command:
        raise CliError("give the command to run after --, e.g. mwms submit . --workers 2 -- python train.py")
    check_command_words(list(command), directory)
    environment = parse_env(env or [])
    memory = parse_memory_option(memory_per_worker)
    if cpus_per_worker is not None and not 0 < cpus_per_worker <= 1024:
        raise CliError(
            f"--cpus-per-worker {cpus_per_worker:g}: give more than 0 and at most 1024, e.g. 4 or 0.5"
        )
    job_priority = None if priority is None else parse_priority(priority)
    job_name = name or directory.resolve().name
    job_environment = submit_environment(
        directory, requirements, python, quiet=json_output, isolated=isolated_env
    )
    digest = pack_and_upload(client, directory, quiet=json_output)
    spec = build_job_spec(
        name=job_name,
        bundle_digest=digest,
        command=list(command),
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        memory_per_worker=memory,
        cpus_per_worker=cpus_per_worker,
        env=environment,
        communication=communication,
        collective_timeout=collective_timeout,
        bytes_per_pack=bytes_per_pack,
        max_restarts=max_restarts,
        restart_on=restart_on,
        fail_on_nan=fail_on_nan,
        startup_timeout=startup_timeout,
        max_runtime=max_runtime,
        hang_timeout=hang_timeout,
        preflight=preflight,
        agents=[a.strip() for a in agents.split(",") if a.strip()] if agents else None,
        priority=job_priority,
        preemptible=preemptible,
        preemption_grace=None if preemption_grace is None else round(preemption_grace),
        environment=job_environment,
    )
    job = client.create_job(spec).raw
    if not json_output:
        print(terminal_safe(job["id"]), flush=True)
    if not wait:
        if json_output:
            print_json(job)
        else:
            job_id = terminal_safe(job["id"])
            err.print(f"follow it: mwms logs {job_id} --follow   (or: mwms status {job_id})")
        return
    final = follow_to_end(client, job["id"], logs_to_stdout=not json_output)
    if json_output:
        print_json(final)
    report_ending(client, final)
    sys.stdout.flush()
    if final.get("state") != "SUCCEEDED":
        raise typer.Exit(int(ExitCode.JOB_NOT_SUCCEEDED))
