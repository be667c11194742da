"""What `mwms submit` does with DIR before the job is created: resolves the job's own Python environment
(--requirements), packs the directory and uploads it (with a progress bar for big bundles)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from mwms.cli.errors import CliError
from mwms.cli.output import err
from mwms.client import Client
from mwms.client.environment import environment_file_in
from mwms.client.environment import resolve as resolve_environment
from mwms.client.packing import PackedBundle, human_size, pack_directory
from mwms.environment_lock import distinct_count, pinned_packages
from mwms.sizes import SizeError, parse_size

# Below this size an upload is over before a progress bar could tell anyone anything.
PROGRESS_BAR_MIN_BYTES = 4 * 1024 * 1024


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


def upload(client: Client, bundle: PackedBundle, *, show_progress: bool) -> str:
    """Uploads a packed bundle, with a progress bar on stderr for big ones; returns its digest."""
    if not show_progress or bundle.size < PROGRESS_BAR_MIN_BYTES:
        return client.upload_bundle(bundle.file)
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("uploading", total=bundle.size)
        return client.upload_bundle(bundle.file, on_bytes=lambda count: progress.advance(task, count))


def pack_and_upload(client: Client, directory: Path, *, quiet: bool = False) -> str:
    """Packs `directory`, uploads it, and returns the bundle digest."""
    bundle = pack_directory(directory)
    try:
        if not quiet:
            err.print(f"packed {bundle.file_count} files from {directory} ({human_size(bundle.size)})")
        return upload(client, bundle, show_progress=not quiet and err.is_terminal)
    finally:
        bundle.close()
