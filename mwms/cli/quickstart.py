"""`mwms quickstart`: a coordinator and two agents on this machine, one Keras job across them, the results.

Everything it starts is stopped again on the way out (also on Ctrl-C or an error) unless --keep-running.
The cluster itself (tokens, addresses, ports, waiting for it) is mwms/cli/quickstart_cluster.py. Before the
job is submitted the quickstart waits a little for the agents' warm interpreters (TensorFlow imported), and
the results say whether each worker started warm or cold, and why. Others may not list the data dir, nor
read its logs and results (mwms/private_files.py).
"""

from __future__ import annotations

import signal
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from mwms.cli.errors import CliError, ExitCode, handles_errors
from mwms.cli.follow import first_failed_task, tail_of_task_logs, watch_job
from mwms.cli.job_commands import download_artifacts
from mwms.cli.output import (
    err,
    format_loss,
    metrics_summary_table,
    out,
    state_change_detail,
    state_text,
)
from mwms.cli.quickstart_cluster import AGENT_NAMES, WARM_POOLS_TIMEOUT_S, LocalCluster
from mwms.cli.quickstart_cluster import quickstart_admin_token as quickstart_admin_token  # re-exported
from mwms.cli.submit import pack_and_upload
from mwms.client import Client
from mwms.client.job_spec import build_job_spec
from mwms.errors import MwmsError

# What the quickstart's dir keeps for its user alone (the coordinator's own dir is made private by
# `mwms server`, each agent's work dir by the agent): the processes' logs, and the job's results.
QUICKSTART_PRIVATE_DIRS = ("logs", "artifacts")
# How a task's log says how it started (worker_agent/task_runs.py): its agent's first line in it.
WARM_START_LINE = "mwms-agent: warm start"
COLD_START_LINE = "mwms-agent: cold start: "
MAX_LOG_TAIL = 10000  # the most lines one log page holds


def example_dir() -> Path:
    """examples/keras_fit, shipped inside the mwms package (mwms/examples; in a source checkout a link)."""
    return Path(str(resources.files("mwms") / "examples" / "keras_fit"))


PLAIN_PROGRESS_EVERY_S = 5.0  # without a terminal: one line of step and loss this often, when they moved


def follow_with_progress(client: Client, job_id: str, total_steps: int) -> dict[str, Any]:
    """Follows the job with a progress bar of its step and loss on a terminal, or a plain line of them every
    few seconds without one (a log file, CI); state changes are printed either way."""
    if not err.is_terminal:
        return follow_with_lines(client, job_id, total_steps)
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    seen_state: list[str | None] = [None]
    with Progress(*columns, console=err) as progress:
        bar = progress.add_task("PENDING", total=total_steps, loss="-")

        def on_job(job: dict[str, Any]) -> None:
            state = job.get("state")
            if state != seen_state[0]:
                line = Text.assemble("job ", state_text(state))
                detail = state_change_detail(job, seen_state[0])
                if detail:
                    line.append(f": {detail}")
                progress.console.print(line)
                seen_state[0] = state
            step = job.get("step")
            total = max(total_steps, step or 0)
            progress.update(
                bar,
                description=str(state),
                completed=step or 0,
                total=total,
                loss=format_loss(job.get("loss")),
            )

        return watch_job(client, job_id, on_job=on_job)


def follow_with_lines(client: Client, job_id: str, total_steps: int) -> dict[str, Any]:
    """Follows the job printing its state changes, and its step and loss at most every few seconds."""
    seen: dict[str, Any] = {"state": None, "progress": None, "printed_at": 0.0}

    def on_job(job: dict[str, Any]) -> None:
        state = job.get("state")
        if state != seen["state"]:
            detail = state_change_detail(job, seen["state"])
            err.print(Text(f"job {state}: {detail}" if detail else f"job {state}"))
            seen["state"] = state
        step = job.get("step")
        progress = (step, job.get("loss"))
        now = time.monotonic()
        if (
            step is not None
            and progress != seen["progress"]
            and now - seen["printed_at"] >= PLAIN_PROGRESS_EVERY_S
        ):
            total = max(total_steps, step)
            err.print(f"step {step}/{total}, loss {format_loss(job.get('loss'))}")
            seen["progress"], seen["printed_at"] = progress, now

    return watch_job(client, job_id, on_job=on_job)


def report_results(client: Client, job: dict[str, Any], data_dir: Path) -> Path | None:
    """Prints the final metrics and downloads the artifacts; returns where they went."""
    points = client.metrics(job["id"])
    if points:
        out.print(Text("Metrics", style="bold"))
        out.print(metrics_summary_table([point.raw for point in points]))
    found = client.artifacts(job["id"])
    if not found:
        err.print("the job saved no artifacts")
        return None
    destination = (data_dir / "artifacts" / job["id"]).resolve()
    download_artifacts(client, job["id"], found, destination)
    return destination


def wait_for_warm_interpreters(cluster: LocalCluster) -> bool:
    """Before the job is submitted: until each agent has a warm interpreter that imported TensorFlow (at
    most WARM_POOLS_TIMEOUT_S), so that both workers start warm; not at all when the agents keep none.
    Returns whether they keep any."""
    if not cluster.keeps_warm_pools():
        err.print("the agents keep no warm interpreters (MWMS_AGENT_WARM_POOL=0): the workers start cold")
        return False
    err.print(
        "waiting for the agents' warm interpreters to import TensorFlow "
        f"(at most {WARM_POOLS_TIMEOUT_S:.0f} s)"
    )
    began = time.monotonic()
    if cluster.wait_for_warm_pools():
        err.print(f"warm interpreters ready after {time.monotonic() - began:.0f} s")
    else:
        err.print(
            f"the warm interpreters were not ready within {WARM_POOLS_TIMEOUT_S:.0f} s: submitting anyway "
            "(a worker may start cold, or wait for its interpreter to finish importing)"
        )
    return True


def start_kinds(client: Client, job: dict[str, Any], warm_pools: bool) -> list[tuple[int, str]]:
    """How each task of the job started, as its log says: (index, "warm" or "cold: <why>"); an agent
    without a warm pool says nothing, so without `warm_pools` every start is cold for that reason."""
    tasks = sorted(job.get("tasks") or [], key=lambda task: task.get("index", 0))
    if not warm_pools:
        return [(task["index"], "cold: the agents keep no warm interpreters") for task in tasks]
    return [(task["index"], how_task_started(client, job["id"], task)) for task in tasks]


def how_task_started(client: Client, job_id: str, task: dict[str, Any]) -> str:
    """ "warm", "cold: <why>", or "(not said in its log)": the agent's line about it in the task's log."""
    try:
        page = client.log_page(job_id, task=task["index"], attempt=task.get("attempt"), tail=MAX_LOG_TAIL)
    except MwmsError:
        return "(its log could not be read)"
    for line in page.lines:
        if line.text.startswith(WARM_START_LINE):
            return "warm"
        if line.text.startswith(COLD_START_LINE):
            return f"cold: {line.text.removeprefix(COLD_START_LINE)}"
    return "(not said in its log)"


def explain_failure(client: Client, job: dict[str, Any], cluster: LocalCluster) -> None:
    if job.get("reason"):
        err.print(f"reason: {job['reason']}")
    culprit = first_failed_task(job)
    if culprit is not None:
        lines = tail_of_task_logs(client, job["id"], culprit["index"], culprit.get("attempt"), 20)
        err.print(f"last {len(lines)} log lines of task {culprit['index']}:", style="bold")
        for text in lines:
            err.print(Text(text))
    err.print(f"coordinator and agent logs: {cluster.log_dir}")


@handles_errors(api_param=None)
def quickstart(
    data_dir: Annotated[
        Path, typer.Option(help="Where the coordinator, agents and results keep their files.")
    ] = Path("mwms-quickstart"),
    keep_running: Annotated[
        bool, typer.Option("--keep-running", help="Leave the coordinator and agents running afterwards.")
    ] = False,
    epochs: Annotated[int, typer.Option(min=1, help="Epochs the example trains.")] = 3,
    steps_per_epoch: Annotated[int, typer.Option(min=1, help="Steps per epoch.")] = 20,
) -> None:
    """Try mwms on one machine: a coordinator, two agents and a 2-worker Keras job, then the results."""
    data_dir = data_dir.resolve()
    example = example_dir()
    if not (example / "train.py").is_file():
        raise CliError(f"the example program is missing: {example / 'train.py'} (reinstall mwms)")
    from mwms.private_files import ForeignFileError, prepare_quickstart_dir  # not at import, as above

    try:
        prepare_quickstart_dir(data_dir, QUICKSTART_PRIVATE_DIRS)
        cluster = LocalCluster(data_dir)
    except ForeignFileError as error:
        raise CliError(str(error)) from None
    # SIGTERM to us should tidy up like Ctrl-C does.
    previous_handler = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    leave_running = False
    job: dict[str, Any] = {}
    try:
        err.print(f"starting a coordinator and two agents (logs in {cluster.log_dir})")
        cluster.start_coordinator()
        cluster.start_agents()
        err.print(f"coordinator at {cluster.api}/, agents {', '.join(AGENT_NAMES)} online")
        err.print(Text(f"task isolation: {cluster.task_isolation()}"))
        warm_pools = wait_for_warm_interpreters(cluster)
        with cluster.client() as client:
            job = _run_example(client, example, epochs, steps_per_epoch, cluster.admin_token_file)
            out.print(Text.assemble("job ", (job["id"], "bold"), " ended ", state_text(job.get("state"))))
            for index, how in start_kinds(client, job, warm_pools):
                out.print(Text(f"worker {index} started {how}"))
            if job.get("state") == "SUCCEEDED":
                destination = report_results(client, job, data_dir)
                if destination:
                    out.print(f"artifacts: {destination}")
            else:
                explain_failure(client, job, cluster)
        leave_running = keep_running
        if keep_running:
            out.print(f"dashboard and API: {cluster.api}/")
            out.print(f"log in with the admin token in {cluster.admin_token_file}")
            err.print(
                f"use the CLI with it: mwms login --api {cluster.api} --token-file {cluster.admin_token_file}"
            )
        elif sys.stdin.isatty():
            _hold_for_the_dashboard(cluster.api, job.get("id", ""), cluster.admin_token_file)
        else:  # no one to press Enter: everything stops now, so no address to open is printed
            err.print("to look around the dashboard afterwards, run again with --keep-running")
    except MwmsError as error:
        raise CliError(
            f"the local coordinator at {cluster.api} failed: {error.detail}; see {cluster.log_dir}",
            ExitCode.UNREACHABLE,
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        if leave_running:
            pids = " ".join(str(process.pid) for process in cluster.processes)
            (data_dir / "quickstart.pids").write_text(pids + "\n")
            err.print(f"left running (pids {pids}); stop them with: kill {pids}")
        else:
            err.print("stopping the coordinator and agents")
            cluster.stop()
    if job.get("state") != "SUCCEEDED":
        raise typer.Exit(int(ExitCode.JOB_NOT_SUCCEEDED))


def _run_example(
    client: Client, example: Path, epochs: int, steps_per_epoch: int, token_file: Path
) -> dict[str, Any]:
    digest = pack_and_upload(client, example, quiet=True)
    # The agents run on this machine, so this interpreter (and its packages) is the one to use.
    command = ["python", "train.py", "--epochs", str(epochs), "--steps-per-epoch", str(steps_per_epoch)]
    spec = build_job_spec(name="quickstart-keras-fit", bundle_digest=digest, command=command, workers=2)
    job = client.create_job(spec).raw
    err.print(f"submitted job {job['id']}: 2 workers, {epochs} epochs × {steps_per_epoch} steps")
    # soft_wrap: an address or path broken over two lines could not be copied
    err.print(f"follow it live at {client.api}/#/jobs/{job['id']}", soft_wrap=True)
    err.print(f"log in there with the admin token in {token_file}", soft_wrap=True)
    return follow_with_progress(client, job["id"], epochs * steps_per_epoch)


def _hold_for_the_dashboard(api: str, job_id: str, token_file: Path) -> None:
    """On a terminal, keeps everything up until Enter or Ctrl-C, so the printed address can be opened."""
    err.print(
        f"the dashboard stays up: open {api}/#/jobs/{job_id} and log in with the token in {token_file} "
        "— press Enter or Ctrl-C to stop everything"
    )
    try:
        input()
    except (KeyboardInterrupt, EOFError):
        pass


def _raise_keyboard_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
