"""`mwms submit`: pack a directory, upload it, create the job, and optionally follow it to its end."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, NamedTuple

import typer
from rich.live import Live
from rich.text import Text
from typer.core import TyperCommand

from mwms.cli.connect import with_client
from mwms.cli.errors import CliError, ExitCode
from mwms.cli.follow import first_failed_task, running_tasks, tail_of_task_logs, watch_job
from mwms.cli.option_slips import close_options, unknown_option_message
from mwms.cli.options import JsonOption
from mwms.cli.output import (
    clear_status_line,
    err,
    format_loss,
    log_line_text,
    out,
    print_json,
    state_change_detail,
    state_text,
)
from mwms.cli.parsing import check_command_words, corrected_submit_line, parse_env, parse_priority
from mwms.cli.safe_text import safe_text, terminal_safe
from mwms.cli.submit_bundle import PROGRESS_BAR_MIN_BYTES as PROGRESS_BAR_MIN_BYTES
from mwms.cli.submit_bundle import pack_and_upload as pack_and_upload
from mwms.cli.submit_bundle import parse_memory_option as parse_memory_option
from mwms.cli.submit_bundle import submit_environment as submit_environment
from mwms.cli.submit_bundle import upload as upload
from mwms.cli.submit_options import (
    AgentsOption,
    BytesPerPackOption,
    CollectiveTimeoutOption,
    CommandArgument,
    CommunicationOption,
    CpusPerWorkerOption,
    DirectoryArgument,
    EnvOption,
    FailOnNanOption,
    GpusPerWorkerOption,
    HangTimeoutOption,
    IsolatedEnvOption,
    MaxRestartsOption,
    MaxRuntimeOption,
    MemoryPerWorkerOption,
    NameOption,
    PreemptibleOption,
    PreemptionGraceOption,
    PreflightOption,
    PriorityOption,
    PythonOption,
    RequirementsOption,
    RestartOnOption,
    StartupTimeoutOption,
    WaitOption,
    WorkersOption,
)
from mwms.client import Client
from mwms.client.job_spec import build_job_spec

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
            detail = state_change_detail(job, self._state)
            if detail:
                line.append(f": {detail}")
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


class CheckedOptions(NamedTuple):
    """Submit's options that are checked or parsed before anything is resolved or uploaded."""

    communication: str | None
    restart_on: str | None
    env: dict[str, str]
    memory_per_worker: int | None
    priority: int | str | None


def check_options(
    directory: Path,
    command: list[str],
    *,
    communication: str | None,
    restart_on: str | None,
    env: list[str] | None,
    memory_per_worker: str | None,
    cpus_per_worker: float | None,
    priority: str | None,
) -> CheckedOptions:
    """Refuses what the coordinator would refuse, or no agent could run, before anything is uploaded; the
    options' values as the job spec takes them."""
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
    return CheckedOptions(communication, restart_on, environment, memory, job_priority)


def agent_names(agents: str | None) -> list[str] | None:
    """--agents 'a, b' -> ['a', 'b']; None when not given (or empty)."""
    return [a.strip() for a in agents.split(",") if a.strip()] if agents else None


def announce_or_follow(client: Client, job: dict[str, Any], *, wait: bool, json_output: bool) -> None:
    """After the job is created: its id on stdout and how to follow it, or (--wait) follows it to its end
    and exits with JOB_NOT_SUCCEEDED unless it SUCCEEDED."""
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


@with_client
def submit(
    client: Client,
    directory: DirectoryArgument,
    command: CommandArgument,
    workers: WorkersOption,
    gpus_per_worker: GpusPerWorkerOption = None,
    memory_per_worker: MemoryPerWorkerOption = None,
    cpus_per_worker: CpusPerWorkerOption = None,
    name: NameOption = None,
    env: EnvOption = None,
    communication: CommunicationOption = None,
    collective_timeout: CollectiveTimeoutOption = None,
    bytes_per_pack: BytesPerPackOption = None,
    max_restarts: MaxRestartsOption = None,
    restart_on: RestartOnOption = None,
    fail_on_nan: FailOnNanOption = None,
    startup_timeout: StartupTimeoutOption = None,
    max_runtime: MaxRuntimeOption = None,
    hang_timeout: HangTimeoutOption = None,
    preflight: PreflightOption = None,
    agents: AgentsOption = None,
    priority: PriorityOption = None,
    preemptible: PreemptibleOption = None,
    preemption_grace: PreemptionGraceOption = None,
    requirements: RequirementsOption = None,
    isolated_env: IsolatedEnvOption = False,
    python: PythonOption = None,
    wait: WaitOption = False,
    json_output: JsonOption = False,
) -> None:
    """Pack DIR, upload it and start a job: mwms submit DIR --workers 2 -- python train.py --epochs 3.

    Prints the job id as the first line of stdout (with --json: the job object instead).
    With --wait, the chief's log follows on stdout and state changes on stderr.
    """
    checked = check_options(
        directory,
        command,
        communication=communication,
        restart_on=restart_on,
        env=env,
        memory_per_worker=memory_per_worker,
        cpus_per_worker=cpus_per_worker,
        priority=priority,
    )
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
        memory_per_worker=checked.memory_per_worker,
        cpus_per_worker=cpus_per_worker,
        env=checked.env,
        communication=checked.communication,
        collective_timeout=collective_timeout,
        bytes_per_pack=bytes_per_pack,
        max_restarts=max_restarts,
        restart_on=checked.restart_on,
        fail_on_nan=fail_on_nan,
        startup_timeout=startup_timeout,
        max_runtime=max_runtime,
        hang_timeout=hang_timeout,
        preflight=preflight,
        agents=agent_names(agents),
        priority=checked.priority,
        preemptible=preemptible,
        preemption_grace=None if preemption_grace is None else round(preemption_grace),
        environment=job_environment,
    )
    job = client.create_job(spec).raw
    announce_or_follow(client, job, wait=wait, json_output=json_output)
