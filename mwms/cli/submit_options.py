"""`mwms submit`'s arguments and options, each a type of its own (typer reads `Annotated` aliases as it reads
them inline), in the order --help lists them; mwms/cli/submit.py's `submit` takes one per parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mwms.cli.durations import DURATION_METAVAR, duration_option_parser

DirectoryArgument = Annotated[
    Path,
    typer.Argument(metavar="DIR", help="Directory with the training program; it is packed and uploaded."),
]

CommandArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="COMMAND...", help="The command each worker runs in the bundle's directory (after --)."
    ),
]

WorkersOption = Annotated[int, typer.Option("--workers", "-n", min=1, help="Number of workers (tasks).")]

GpusPerWorkerOption = Annotated[
    int | None, typer.Option("--gpus-per-worker", min=0, help="GPUs per worker; 0 runs on CPU slots.")
]

MemoryPerWorkerOption = Annotated[
    str | None,
    typer.Option(
        "--memory-per-worker",
        metavar="SIZE",
        help="Memory each worker may use, e.g. 8G or 512M (binary units): past it the agent kills the "
        "worker (out of memory), and placement counts it against each agent's memory [default: the "
        "agent's share for tasks].",
        show_default=False,
    ),
]

CpusPerWorkerOption = Annotated[
    float | None,
    typer.Option(
        "--cpus-per-worker",
        metavar="N",
        help="CPUs each worker may use at most, e.g. 4 or 0.5 (a cap, not a reservation) [default: no cap].",
        show_default=False,
    ),
]

NameOption = Annotated[str | None, typer.Option(help="Job name; default: the directory's name.")]

EnvOption = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", help="NAME=VALUE for the workers' environment; repeatable."),
]

CommunicationOption = Annotated[
    str | None,
    typer.Option(help="Collective implementation: AUTO, RING or NCCL.", case_sensitive=False),
]

CollectiveTimeoutOption = Annotated[
    float | None,
    typer.Option(
        parser=duration_option_parser(allow_zero=True),
        metavar=DURATION_METAVAR,
        help="Timeout of each collective, e.g. 10m.",
    ),
]

BytesPerPackOption = Annotated[int | None, typer.Option(help="Collective bytes per pack.", min=0)]

MaxRestartsOption = Annotated[int | None, typer.Option(help="How often a failed job is restarted.", min=0)]

RestartOnOption = Annotated[
    str | None, typer.Option(help="'retryable' (signals, lost agents) or 'any' non-zero exit.")
]

FailOnNanOption = Annotated[
    list[str] | None,
    typer.Option(
        "--fail-on-nan",
        metavar="NAME",
        help="Fail the job at once, without a restart, when metric NAME is reported as NaN (restart.fail_on_nan); repeatable.",
    ),
]

StartupTimeoutOption = Annotated[
    float | None,
    typer.Option(
        parser=duration_option_parser(allow_zero=True),
        metavar=DURATION_METAVAR,
        help="How long all workers may take to start running, e.g. 5m.",
    ),
]

MaxRuntimeOption = Annotated[
    float | None,
    typer.Option(
        parser=duration_option_parser(allow_zero=True),
        metavar=DURATION_METAVAR,
        help="How long the job may run before it is failed, e.g. 12h.",
    ),
]

HangTimeoutOption = Annotated[
    float | None,
    typer.Option(
        parser=duration_option_parser(allow_zero=True),
        metavar=DURATION_METAVAR,
        help="How long without a metric point or log line, e.g. 10m, after which a RUNNING job counts "
        "as hung: its stacks are dumped and it is restarted (0: off).",
    ),
]

PreflightOption = Annotated[
    bool | None,
    typer.Option(
        "--preflight/--no-preflight",
        help="Check that the workers reach each other and measure all-reduce bandwidth before the program.",
    ),
]

AgentsOption = Annotated[
    str | None,
    typer.Option(
        "--agents",
        help="Comma-separated agent names (or ids), one per worker: worker i runs on the i-th.",
    ),
]

PriorityOption = Annotated[
    str | None,
    typer.Option(
        "--priority",
        help="0-1000, higher is placed first (and may preempt lower ones), or low (250), normal (500), "
        "high (750); users may give up to the coordinator's MWMS_USER_PRIORITY_CEILING [default: normal].",
        show_default=False,
    ),
]

PreemptibleOption = Annotated[
    bool | None,
    typer.Option(
        "--preemptible/--no-preemptible",
        help="--no-preemptible: never preempt this job (it then never borrows idle capacity over its "
        "team's quota) [default: preemptible].",
        show_default=False,
    ),
]

PreemptionGraceOption = Annotated[
    float | None,
    typer.Option(
        "--preemption-grace",
        parser=duration_option_parser(allow_zero=True, maximum=3600),
        metavar=DURATION_METAVAR,
        help="Time, e.g. 30s (at most 1h), between the SIGTERM that preempts the workers and the SIGKILL, to save a checkpoint "
        "[default: the coordinator's MWMS_PREEMPTION_GRACE_S].",
        show_default=False,
    ),
]

RequirementsOption = Annotated[
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
]

IsolatedEnvOption = Annotated[
    bool,
    typer.Option(
        "--isolated-env",
        help="With --requirements: the environment holds those packages alone (and mwms_runtime), "
        "not the agents' TensorFlow; pin tensorflow and tf-keras in the file yourself.",
    ),
]

PythonOption = Annotated[
    str | None,
    typer.Option(
        "--python",
        help="The Python version of the job's own environment, e.g. 3.11 (with --requirements) "
        "[default: the agents' interpreter].",
        show_default=False,
    ),
]

WaitOption = Annotated[
    bool, typer.Option("--wait", help="Follow the job to its end; exit 0 only if it SUCCEEDED.")
]
