"""`Client`: submit and watch mwms jobs from Python (notebooks, scripts, pipeline steps).

from mwms import Client

client = Client()  # the coordinator and token that `mwms login` / MWMS_API / MWMS_TOKEN name
job = client.submit("examples/keras_fit", ["python", "train.py"], workers=2)
job.wait(on_progress=lambda job: print(job.state, job.step, job.loss))
print(job.metrics().to_pandas())
job.download("artifacts/")
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from mwms.client.admin import AdminMethods
from mwms.client.diagnostics import Preflight, StackDump
from mwms.client.environment import resolve as resolve_environment
from mwms.client.job import Job
from mwms.client.job_spec import build_job_spec
from mwms.client.models import Artifact, MetricPoint, Metrics
from mwms.client.packing import pack_directory
from mwms.client.pages import JobPage, LogPage
from mwms.client.rest import RestApi
from mwms.client.sharing import SharingMethods
from mwms.client.transport import Transport
from mwms.connection import Connection, resolve_connection
from mwms.errors import InvalidSpec
from mwms.sizes import SizeError, parse_size

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRY_S = 30.0


def new_idempotency_key() -> str:
    """A fresh key for one submit: resends of that submit carry it, a new submit gets a new one."""
    return uuid.uuid4().hex


def memory_bytes(size: int | str, what: str = "memory_per_worker") -> int:
    """A memory size as bytes: an int as it is, a string as a size ("8G", "512MiB", binary units);
    InvalidSpec for one that is not."""
    if isinstance(size, bool):
        raise InvalidSpec(f"{what}={size!r}: give bytes or a size such as 8G or 512M")
    if isinstance(size, int):
        return size
    try:
        return parse_size(str(size), what)
    except SizeError as error:
        raise InvalidSpec(str(error)) from None


class Client(SharingMethods, AdminMethods):
    """A connection to one mwms coordinator.

    `api`, `token` and `ca_file` default to what the CLI uses: MWMS_API / MWMS_TOKEN / MWMS_CA_FILE,
    else what `mwms login` saved, else http://127.0.0.1:8080 without a token. Requests that cannot
    do harm twice are retried for up to `retry_seconds` while the coordinator is unreachable (e.g.
    restarting), and the first retry of a request is told to `on_retry` (else logged as a warning); a
    refused connection before any answer is retried for 2 s only, and an address that is the coordinator's
    gRPC port raises `NotACoordinator` at once. Every failure is an `mwms.errors.MwmsError`. Use it as a
    context manager, or `close()`.

    The queue, teams, quotas and agents (mwms/client/sharing.py) and identity, tokens and removing agents
    (mwms/client/admin.py) are methods of it too.
    """

    def __init__(
        self,
        api: str | None = None,
        token: str | None = None,
        ca_file: str | Path | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry_seconds: float = DEFAULT_RETRY_S,
        connection: Connection | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self.connection = connection or resolve_connection(api, token, ca_file)
        self._transport = Transport(
            self.connection.api,
            token=self.connection.token,
            verify=self.connection.verify(),
            timeout=timeout,
            retry_seconds=retry_seconds,
            on_retry=on_retry,
        )
        self.rest = RestApi(self._transport)

    @classmethod
    def for_connection(
        cls,
        connection: Connection,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry_seconds: float = DEFAULT_RETRY_S,
        on_retry: Callable[[str], None] | None = None,
    ) -> Client:
        """A client for an already resolved connection (no lookup of flags, environment or config)."""
        return cls(connection=connection, timeout=timeout, retry_seconds=retry_seconds, on_retry=on_retry)

    @property
    def api(self) -> str:
        """The coordinator's address, e.g. http://127.0.0.1:8080."""
        return self.connection.api

    def close(self) -> None:
        """Closes the HTTP connections."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(api={self.api!r})"

    # -- jobs --------------------------------------------------------------------------------------------

    def upload(self, directory: str | Path, *, on_bytes: Callable[[int], None] | None = None) -> str:
        """Packs `directory` like `mwms submit` does (skipping .git, __pycache__, .venv), uploads it and
        returns the bundle's digest."""
        bundle = pack_directory(Path(directory))
        try:
            return self.upload_bundle(bundle.file, on_bytes=on_bytes)
        finally:
            bundle.close()

    def upload_bundle(self, file: IO[bytes], *, on_bytes: Callable[[int], None] | None = None) -> str:
        """Uploads an already packed .tar.gz bundle (a file open for reading, rewound on a resend) and
        returns its digest; `on_bytes` is told each chunk's size as it goes out."""
        return str(self.rest.upload_bundle(file, on_bytes=on_bytes)["digest"])

    def submit(
        self,
        directory: str | Path,
        command: str | Sequence[str],
        *,
        workers: int,
        gpus_per_worker: int | None = None,
        memory_per_worker: int | str | None = None,
        cpus_per_worker: float | None = None,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        restart: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        requirements: str | Path | None = None,
        python: str | None = None,
        isolated_env: bool = False,
        **options: Any,
    ) -> Job:
        """Packs and uploads `directory` and starts `command` on `workers` workers; returns the Job.

        `requirements` (a requirements.txt, pyproject.toml or uv.lock, relative to `directory`) gives the
        job a Python environment of its own: resolved here once with uv, built on each agent, the same
        packages for every worker; `python` ("3.11") the version to build it with (default: the agents').
        The environment extends the agents' runtime (TensorFlow, tf-keras and numpy stay importable, the
        job's pins first); `isolated_env=True` makes it hold the requirements alone.

        `memory_per_worker` is the memory each worker may use, in bytes or as a size ("8G", "512MiB";
        binary units): its tasks are killed past it, and placement counts it against each agent's memory.
        `cpus_per_worker` caps the CPUs each worker may use (2, 0.5). Unset: the agents' defaults.

        `command` is an argv list, or a string split like a shell would. `restart` is the restart policy,
        e.g. {"max_restarts": 0} or {"restart_on": "any", "fail_on_nan": ["loss"]}. `options` are
        further job spec fields, passed as given: communication={"implementation": "RING"},
        startup_timeout_seconds=..., max_runtime_seconds=... (see the API's JobCreate at /docs).
        The job's name defaults to the directory's name. The submit carries an idempotency key (a new one
        unless given), so resending it after a dropped connection never creates a second job.
        """
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if (python is not None or isolated_env) and requirements is None:
            what = "python=" if python is not None else "isolated_env="
            raise InvalidSpec(f"{what} is about a job's own environment: give requirements= too")
        # Resolved before the upload: a requirement that cannot be resolved costs no upload.
        environment = (
            None
            if requirements is None
            else resolve_environment(directory, requirements, python, isolated=isolated_env)
        )
        memory = None if memory_per_worker is None else memory_bytes(memory_per_worker)
        spec = build_job_spec(
            name=name or Path(directory).resolve().name,
            bundle_digest=self.upload(directory),
            command=argv,
            workers=workers,
            gpus_per_worker=gpus_per_worker,
            memory_per_worker=memory,
            cpus_per_worker=cpus_per_worker,
            env=dict(env) if env else None,
            environment=environment,
        )
        if restart:
            spec["restart"] = dict(restart)
        spec.update(options)
        return self.create_job(spec, idempotency_key=idempotency_key)

    def create_job(self, spec: Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Starts a job from a full spec (the body of POST /api/v1/jobs) whose bundle is uploaded already."""
        key = idempotency_key or new_idempotency_key()
        return Job(self, self.rest.create_job(dict(spec), idempotency_key=key))

    def job(self, job_id: str) -> Job:
        """The job with this id; `NotFound` if there is none."""
        return Job(self, self.rest.get_job(job_id))

    def jobs(
        self, state: str | Sequence[str] | None = None, *, limit: int = 50, offset: int = 0
    ) -> list[Job]:
        """Jobs, newest first, optionally only those in `state` (one state or several).

        The list entries are summaries (no tasks or events); `refresh()` one for everything.
        """
        states = [state] if isinstance(state, str) else list(state or [])
        return self.job_page(states, limit=limit, offset=offset).jobs

    def job_page(self, states: Sequence[str] = (), *, limit: int = 50, offset: int = 0) -> JobPage:
        """One page of jobs, newest first (those in any of `states`, or all), and how many match in all."""
        wanted = [value.upper() for value in states]
        return JobPage.from_api(self, self.rest.list_jobs(wanted, offset=offset, limit=limit))

    def set_priority(self, job: str | Job, priority: int | str) -> Job:
        """Changes a pending job's priority: 0-1000 (higher is placed first) or "low", "normal", "high".

        Users may go up to the coordinator's MWMS_USER_PRIORITY_CEILING (default 500), admins anywhere;
        a job that is no longer waiting keeps its priority (`Conflict`).
        """
        return Job(self, self.rest.set_priority(_job_id(job), priority))

    def cancel(self, job: str | Job) -> Job:
        """Cancels a job (its tasks are stopped) and returns it; `Conflict` if it had ended."""
        return Job(self, self.rest.cancel_job(_job_id(job)))

    # -- what a job left: logs, metrics, artifacts, diagnostics ------------------------------------------

    def log_page(
        self,
        job: str | Job,
        *,
        task: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
        after: int | None = None,
    ) -> LogPage:
        """One page of a job's log lines, oldest first: the newest `tail` (the API's default: 1000), or
        those past the cursor `after` (`LogPage.next_after` of the page before); `Job.logs` to follow."""
        raw = self.rest.logs(_job_id(job), task=task, attempt=attempt, tail=tail, after=after)
        return LogPage.from_api(raw)

    def metrics(
        self,
        job: str | Job,
        name: str | None = None,
        *,
        min_step: int | None = None,
        max_step: int | None = None,
        attempt: int | None = None,
    ) -> Metrics:
        """Every metric point a job reported (or of `name`, within the steps, of `attempt`), read page by
        page, ordered by name, attempt and step."""
        points = self.rest.all_metrics(
            _job_id(job), name=name, min_step=min_step, max_step=max_step, attempt=attempt
        )
        return Metrics(MetricPoint.from_api(point) for point in points)

    def artifacts(self, job: str | Job) -> list[Artifact]:
        """The files a job's chief saved in MWMS_OUTPUT_DIR; `Job.download` fetches them."""
        return [Artifact.from_api(raw) for raw in self.rest.list_artifacts(_job_id(job))]

    def preflight(self, job: str | Job) -> Preflight:
        """A job's preflight check results, per attempt and task (none when no check ran)."""
        return Preflight.from_api(self.rest.job_preflight(_job_id(job)))

    def take_stacks(self, job: str | Job) -> StackDump:
        """Takes the Python stacks of a running job's tasks now (never resent: each call takes a new dump;
        the coordinator waits up to 10 s for its agents)."""
        return StackDump.from_api(self.rest.dump_stacks(_job_id(job)))

    def stacks(self, job: str | Job, request_id: str | None = None) -> StackDump:
        """A job's newest stack dump (taken on request or by hang detection), or the one `request_id` names."""
        return StackDump.from_api(self.rest.job_stacks(_job_id(job), request_id))

    # -- the coordinator ---------------------------------------------------------------------------------

    def health(self) -> bool:
        """True when the coordinator answers /healthz (asked once, without retries)."""
        return self.rest.health()


def _job_id(job: str | Job) -> str:
    return job.id if isinstance(job, Job) else job
