"""`mwms quickstart`: a coordinator and two agents on this machine, one Keras job across them, the results.

Everything it starts is stopped again on the way out (also on Ctrl-C or an error) unless --keep-running.
The coordinator gets an admin token and a join token through its environment (never its command line,
where `ps` shows them); the admin token is kept in <data dir>/admin-token (0600) for the dashboard's
log-in and for the CLI, and reused on the next run. Others may not list the data dir, nor read its logs
and results (mwms/private_files.py).
"""

from __future__ import annotations

import json
import os
import random
import secrets
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
from mwms.cli.output import err, first_line, format_loss, metrics_summary_table, out, state_text
from mwms.cli.processes import (
    ManagedProcess,
    last_lines,
    mwms_command,
    start_process,
    stop_processes,
)
from mwms.cli.submit import pack_and_upload
from mwms.client import Client
from mwms.client.job_spec import build_job_spec
from mwms.connection import Connection
from mwms.errors import MwmsError

AGENT_NAMES = ("local-1", "local-2")
SERVER_START_TIMEOUT_S = 60.0
AGENTS_ONLINE_TIMEOUT_S = 60.0
PORTS_PER_AGENT = 50
ADMIN_TOKEN_FILE = "admin-token"
# What the quickstart's dir keeps for its user alone (the coordinator's own dir is made private by
# `mwms server`, each agent's work dir by the agent): the processes' logs, and the job's results.
QUICKSTART_PRIVATE_DIRS = ("logs", "artifacts")
MIN_TOKEN_LENGTH = 16  # what the coordinator accepts as MWMS_ADMIN_TOKEN


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def quickstart_admin_token(path: Path) -> str:
    """The admin token saved in `path` by an earlier run, else a new one written there (0600)."""
    try:
        saved = path.read_text().strip()
    except OSError:
        saved = ""
    if len(saved) >= MIN_TOKEN_LENGTH and not any(character.isspace() for character in saved):
        from mwms.private_files import make_private_file  # not at import: `mwms --help` stays light

        make_private_file(path)  # 0600; ForeignFileError when another user owns it
        return saved
    secret = new_secret()
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secret + "\n")
    return secret


def example_dir() -> Path:
    """examples/keras_fit, shipped inside the mwms package (mwms/examples; in a source checkout a link)."""
    return Path(str(resources.files("mwms") / "examples" / "keras_fit"))


def _wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False


class LocalCluster:
    """The coordinator and agents quickstart runs, with their log files under `data_dir/logs`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log_dir = data_dir / "logs"
        self.processes: list[ManagedProcess] = []
        self.http_port = 0
        self.grpc_port = 0
        self.admin_token_file = data_dir / ADMIN_TOKEN_FILE
        self.admin_token = quickstart_admin_token(self.admin_token_file)
        self.join_token = new_secret()  # lives as long as this coordinator process

    def client(self, timeout: float = 30.0) -> Client:
        """A client of the local coordinator with the admin token (the user's own settings do not apply)."""
        return Client.for_connection(Connection(api=self.api, token=self.admin_token), timeout=timeout)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start_coordinator(self) -> None:
        """Starts the coordinator on ports it picks (port 0), learns them from its ports file, and waits
        for /healthz: no free port is picked here, so there is no race to lose."""
        ports_file = self.data_dir / "coordinator" / "ports.json"
        ports_file.unlink(missing_ok=True)
        argv = [
            *mwms_command(),
            "server",
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--data-dir",
            str(self.data_dir / "coordinator"),
            "--ports-file",
            str(ports_file),
        ]
        secrets_env = {"MWMS_ADMIN_TOKEN": self.admin_token, "MWMS_JOIN_TOKEN": self.join_token}
        coordinator = start_process("coordinator", argv, self.log_dir / "coordinator.log", secrets_env)
        self.processes.append(coordinator)
        _wait_until(lambda: ports_file.exists() or not coordinator.running(), SERVER_START_TIMEOUT_S)
        if not coordinator.running() or not ports_file.exists():
            raise CliError(self._failure("the coordinator did not start", coordinator), ExitCode.UNREACHABLE)
        ports = json.loads(ports_file.read_text())
        self.http_port, self.grpc_port = int(ports["http"]), int(ports["grpc"])
        if not self._wait_healthy(coordinator):
            raise CliError(
                self._failure("the coordinator did not become healthy", coordinator), ExitCode.UNREACHABLE
            )

    def _wait_healthy(self, coordinator: ManagedProcess) -> bool:
        """True once /healthz answers; False if the process exits or the time runs out first."""
        with self.client(timeout=2.0) as client:
            _wait_until(lambda: client.health() or not coordinator.running(), SERVER_START_TIMEOUT_S)
            return coordinator.running() and client.health()

    def start_agents(self) -> None:
        """Starts one agent per name, each with its own work dir and port range, and waits until both are online."""
        base = 20000 + random.randrange(0, 400) * 100  # two quickstarts side by side rarely collide
        for number, name in enumerate(AGENT_NAMES):
            low = base + number * PORTS_PER_AGENT
            argv = [
                *mwms_command(),
                "agent",
                "--server",
                f"127.0.0.1:{self.grpc_port}",
                "--name",
                name,
                "--work-dir",
                str(self.data_dir / "agents" / name),
                "--slots",
                "1",
                "--advertise-address",
                "127.0.0.1",
                "--port-range",
                f"{low}-{low + PORTS_PER_AGENT - 1}",
            ]
            join_env = {"MWMS_JOIN_TOKEN": self.join_token}
            self.processes.append(start_process(name, argv, self.log_dir / f"{name}.log", join_env))
        with self.client() as client:

            def both_online() -> bool:
                for process in self.processes:
                    if not process.running():
                        raise CliError(self._failure(f"{process.name} exited", process), ExitCode.UNREACHABLE)
                online = {agent.name for agent in client.agents() if agent.online}
                return online.issuperset(AGENT_NAMES)

            if not _wait_until(both_online, AGENTS_ONLINE_TIMEOUT_S, 0.5):
                raise CliError(
                    f"the agents did not come online within {AGENTS_ONLINE_TIMEOUT_S:.0f}s; "
                    f"see the logs in {self.log_dir}",
                    ExitCode.UNREACHABLE,
                )

    def task_isolation(self) -> str:
        """How the agents confine their tasks, as they registered it; said plainly when not at all."""
        with self.client() as client:
            labels = {agent.task_isolation or "unknown" for agent in client.agents()}
        text = "; ".join(sorted(labels))
        if "share" in text:
            text += (
                " (fine for your own jobs on this machine; run agents as root with bubblewrap for others')"
            )
        return text

    def _failure(self, what: str, process: ManagedProcess) -> str:
        tail = "\n".join(f"  {line}" for line in last_lines(process.log_path, 20))
        code = process.popen.returncode
        exit_note = f" (exit code {code})" if code is not None else ""
        return f"{what}{exit_note}; its log is {process.log_path}" + (f":\n{tail}" if tail else "")

    def stop(self) -> None:
        stop_processes(self.processes)


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
                if job.get("reason") and state != "RUNNING":
                    line.append(f": {first_line(job['reason'])}")
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
            line = f"job {state}"
            if job.get("reason") and state != "RUNNING":
                line += f": {first_line(job['reason'])}"
            err.print(Text(line))
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
        with cluster.client() as client:
            job = _run_example(client, example, epochs, steps_per_epoch, cluster.admin_token_file)
            out.print(Text.assemble("job ", (job["id"], "bold"), " ended ", state_text(job.get("state"))))
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
