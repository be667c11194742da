"""The `mwms` command: the typer app and the wiring of its commands (the daemons' in mwms/cli/daemons.py).

Heavy imports (the coordinator, the agent, TensorFlow) happen inside commands so `mwms --help` stays fast.
"""

from __future__ import annotations

import os

from mwms import grpc_process

# gRPC reads its process-wide settings once, as it loads: before anything here imports it.
os.environ.update(grpc_process.missing_from(os.environ))
from typing import Annotated

import typer

from mwms import __version__
from mwms.cli import (
    admin_commands,
    auth_commands,
    daemons,
    job_commands,
    quickstart,
    sharing_commands,
    submit,
)
from mwms.cli.doctor import doctor
from mwms.cli.errors import EXIT_CODES_HELP, ExitCode
from mwms.cli.option_slips import SuggestingGroup
from mwms.cli.stacks_command import stacks

app = typer.Typer(
    name="mwms",
    cls=SuggestingGroup,
    help="Run TensorFlow MultiWorkerMirroredStrategy jobs on a fleet of machines.\n\n"
    "Start a coordinator (`mwms server`), an agent per machine (`mwms agent`), then `mwms submit`. "
    "Try it all on one machine with `mwms quickstart`.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        print(f"mwms {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Run TensorFlow MultiWorkerMirroredStrategy jobs on a fleet of machines."""


# `mwms agent [OPTIONS]` runs an agent; `mwms agent cordon|uncordon|drain NAME` acts on one (admin).
agent_app = typer.Typer(
    name="agent",
    invoke_without_command=True,
    no_args_is_help=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
agent_app.callback()(daemons.agent)

app.command()(daemons.server)
app.add_typer(agent_app)
agent_app.command("cordon")(sharing_commands.cordon)
agent_app.command("uncordon")(sharing_commands.uncordon)
agent_app.command("drain")(sharing_commands.drain)
app.command(cls=submit.SubmitCommand)(submit.submit)
app.command()(sharing_commands.priority)
app.command()(sharing_commands.queue)
app.add_typer(sharing_commands.team_app)
app.add_typer(sharing_commands.quota_app)
app.command()(job_commands.jobs)
app.command()(job_commands.status)
app.command()(job_commands.logs)
app.command()(job_commands.cancel)
app.command()(job_commands.metrics)
app.command()(job_commands.artifacts)
app.command()(job_commands.agents)
app.command()(stacks)
app.command()(quickstart.quickstart)
app.command()(doctor)
app.command()(auth_commands.login)
app.command()(auth_commands.logout)
app.command()(auth_commands.whoami)
app.add_typer(admin_commands.token_app)
app.add_typer(admin_commands.agent_token_app)
app.command("remove-agent")(admin_commands.remove_agent)

__all__ = ["app", "ExitCode"]

if __name__ == "__main__":
    app()
