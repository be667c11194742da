"""`Job`: one job on the coordinator, with what a script does with it: wait, logs, metrics, artifacts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from mwms import agent_defaults
from mwms.client.models import Artifact, LogLine, Metrics, parse_number
from mwms.errors import CoordinatorUnreachable, InvalidSpec, JobFailed, WaitTimeout

if TYPE_CHECKING:
    from mwms.client.client import Client

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
FAILURE_LOG_LINES = 20
# How long `wait` keeps polling while the coordinator cannot be reached (e.g. while it restarts).
UNREACHABLE_GRACE_S = 120.0
# Task states after which the task's process is gone (LOST: its agent is gone, nobody can say more).
ENDED_TASK_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED", "REJECTED", "LOST"})
# A job's state is final as soon as the coordinator decides it (a cancel, a failed task), while its other
# tasks are still being stopped; `wait` then waits for them too, at most the job's own stop grace (or
# this guess: a coordinator's MWMS_STOP_GRACE_S is not known here) plus a margin for the agents' reports
# (a lost agent's tasks are marked LOST within the coordinator's agent timeout, 10 s by default).
DEFAULT_STOP_GRACE_S = agent_defaults.STOP_GRACE_S  # the longest an agent gives a task by default
TASK_ENDS_MARGIN_S = 30.0


def running_tasks(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks of the job's newest attempt that have not ended yet."""
    return [t for t in job.get("tasks") or [] if t.get("state") not in ENDED_TASK_STATES]


def task_ends_deadline_s(job: dict[str, Any]) -> float:
    """How long to wait for the tasks of an ended job to end: the grace they were given, and a margin."""
    grace = job.get("preemption_grace_seconds")
    own = float(grace) if isinstance(grace, (int, float)) and not isinstance(grace, bool) else 0.0
    return max(own, DEFAULT_STOP_GRACE_S) + TASK_ENDS_MARGIN_S


def first_failed_task(job: dict[str, Any]) -> dict[str, Any] | None:
    """The task that most likely caused the job to end badly: a failed one, else any non-successful one."""
    tasks = sorted(job.get("tasks") or [], key=lambda task: task.get("index", 0))
    for wanted in ({"FAILED"}, {"LOST", "REJECTED"}, {"STOPPED"}):
        for task in tasks:
            if task.get("state") in wanted:
                return task
    return tasks[0] if tasks else None


def safe_relative_path(path: str) -> PurePosixPath:
    """An artifact path as a relative path that stays inside the download directory, or InvalidSpec."""
    candidate = PurePosixPath(path)
    if not path or candidate.is_absolute() or ".." in candidate.parts or "\\" in path:
        raise InvalidSpec(
            f"refusing artifact path {path!r}: it would be written outside the download directory"
        )
    return candidate


class Job:
    """A job as last fetched from the coordinator; `refresh()` fetches it again.

    `raw` is the API's job object; the properties read from it.
    """

    def __init__(self, client: Client, raw: dict[str, Any]) -> None:
        self._client = client
        self.raw = raw

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, name={self.name!r}, state={self.state!r})"

    # -- what the job is ---------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The job's id."""
        return str(self.raw["id"])

    @property
    def name(self) -> str:
        """The job's name."""
        return str(self.raw.get("name") or "")

    @property
    def state(self) -> str:
        """PENDING, SCHEDULED, RUNNING, RESTARTING, PREEMPTING, SUCCEEDED, FAILED or CANCELLED (as last
        fetched); PREEMPTING: its workers were asked to stop to make room, after which it waits again."""
        return str(self.raw.get("state") or "")

    @property
    def done(self) -> bool:
        """True once the job has ended (SUCCEEDED, FAILED or CANCELLED)."""
        return self.state in TERMINAL_STATES

    @property
    def reason(self) -> str:
        """Why the job is in its state (a failure's explanation), or ""."""
        return str(self.raw.get("reason") or "")

    @property
    def step(self) -> int | None:
        """The newest step the chief reported, or None."""
        step = self.raw.get("step")
        return None if step is None else int(step)

    @property
    def loss(self) -> float | None:
        """The newest loss the chief reported (NaN and ±inf as floats), or None."""
        return parse_number(self.raw.get("loss"))

    @property
    def priority(self) -> int | None:
        """Its priority, 0-1000 (higher is placed first); None from a coordinator that does not say."""
        priority = self.raw.get("priority")
        return None if priority is None else int(priority)

    @property
    def attempts(self) -> int:
        """How many attempts the job has had (restarts + 1 once it started)."""
        return int(self.raw.get("attempts") or 0)

    @property
    def tasks(self) -> list[dict[str, Any]]:
        """The newest attempt's tasks, as the API describes them."""
        return list(self.raw.get("tasks") or [])

    # -- following it ------------------------------------------------------------------------------------

    def refresh(self) -> Job:
        """Fetches the job again; returns itself."""
        self.raw = self._client.rest.get_job(self.id)
        return self

    def wait(
        self,
        timeout: float | None = None,
        on_progress: Callable[[Job], None] | None = None,
        *,
        poll_interval: float = 1.0,
        raise_on_failure: bool = True,
        unreachable_grace: float = UNREACHABLE_GRACE_S,
    ) -> str:
        """Polls until the job ends and returns its final state ("SUCCEEDED" or "CANCELLED").

        "Ends" means the job's state is final and every task of its newest attempt has ended too (a
        cancelled or failed job's chief may still write files until then), waiting for those at most
        `task_ends_deadline_s` after the state; a task that did not end by then is still in `tasks`.
        Calls `on_progress(job)` after every poll. A job that ends FAILED raises `JobFailed` with the
        reason and the end of the failing task's log (returns "FAILED" with raise_on_failure=False).
        `timeout` (seconds) raises `WaitTimeout` while the job keeps running. While the coordinator
        cannot be reached (a restart), polling goes on for up to `unreachable_grace` seconds; a
        `CoordinatorUnreachable` raised by `on_progress` (e.g. fetching logs) counts as the same outage.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        unreachable_since: float | None = None
        while True:
            started = time.monotonic()
            try:
                self.refresh()
                if on_progress is not None:
                    on_progress(self)
                unreachable_since = None
            except CoordinatorUnreachable:
                unreachable_since = unreachable_since or started
                if time.monotonic() - unreachable_since > unreachable_grace:
                    raise
            else:
                if self.done:
                    break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise WaitTimeout(
                    f"job {self.id} is still {self.state} after {timeout:g} s; it keeps running"
                )
            pause = max(0.0, poll_interval - (now - started))
            time.sleep(pause if deadline is None else min(pause, max(0.0, deadline - now)))
        self._wait_for_task_ends(on_progress, poll_interval, deadline)
        if self.state == "FAILED" and raise_on_failure:
            raise self.failure()
        return self.state

    def _wait_for_task_ends(
        self, on_progress: Callable[[Job], None] | None, poll_interval: float, timeout_at: float | None
    ) -> None:
        deadline = time.monotonic() + task_ends_deadline_s(self.raw)
        if (
            timeout_at is not None
        ):  # the job has ended: past the caller's timeout, its tasks are not waited for
            deadline = min(deadline, timeout_at)
        while running_tasks(self.raw) and time.monotonic() < deadline:
            time.sleep(min(poll_interval, 0.25))
            try:
                self.refresh()
                if on_progress is not None:
                    on_progress(self)
            except CoordinatorUnreachable:
                return  # the job's end is known; what its tasks do now cannot be asked

    def failure(self) -> JobFailed:
        """A `JobFailed` describing how this job ended: its reason and the failing task's last log lines."""
        culprit = first_failed_task(self.raw)
        task = None if culprit is None else int(culprit.get("index", 0))
        lines: list[str] = []
        if culprit is not None:
            page = self._client.log_page(
                self.id, task=task, attempt=culprit.get("attempt"), tail=FAILURE_LOG_LINES
            )
            lines = [line.text for line in page.lines]
        return JobFailed(self.id, self.reason, state=self.state, task=task, log_lines=lines)

    def logs(
        self,
        task: int | None = None,
        follow: bool = False,
        *,
        attempt: int | None = None,
        tail: int | None = None,
    ) -> Iterator[LogLine]:
        """The job's log lines, oldest first: the newest `tail` (the API's default: 1000) of them, or, with
        follow=True, those and every new one until the job ends (reconnecting if the coordinator restarts).

        A line redrawn in place (`\\r`, a progress bar) comes as its newest state; following, each newer
        state comes too (at most about one a second), with `redraw=True`: it replaces the line before it
        of the same task and stream.
        """
        rest = self._client.rest
        if not follow:
            yield from self._client.log_page(self.id, task=task, attempt=attempt, tail=tail).lines
            return
        after: int | None = None
        unreachable_since: float | None = None
        while True:
            try:
                for raw in rest.follow_logs(
                    self.id, task=task, attempt=attempt, tail=tail if after is None else None, after=after
                ):
                    line = LogLine.from_api(raw)
                    after = line.id or after
                    unreachable_since = None
                    yield line
                # The coordinator also ends a follow that stayed idle for long, or when it shuts down.
                if self.refresh().done:
                    return
            except CoordinatorUnreachable:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > UNREACHABLE_GRACE_S:
                    raise
                time.sleep(1.0)

    def metrics(self, name: str | None = None, *, attempt: int | None = None) -> Metrics:
        """The metric points the chief reported (all names, or `name`): a list with `to_pandas()`, whose
        `per_step()` and `per_epoch()` keep steps and epochs apart."""
        return self._client.metrics(self.id, name, attempt=attempt)

    def artifacts(self) -> list[Artifact]:
        """The files the chief saved in MWMS_OUTPUT_DIR (`mwms_runtime.output_dir()`)."""
        return self._client.artifacts(self.id)

    def download(self, dest: str | Path, artifacts: list[Artifact] | None = None) -> list[Path]:
        """Downloads every artifact (or those given) under `dest`, keeping relative paths; returns the files."""
        destination = Path(dest).expanduser()
        chosen = self.artifacts() if artifacts is None else artifacts
        relatives = [safe_relative_path(artifact.path) for artifact in chosen]  # check all before writing
        destination.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for relative in relatives:
            target = destination.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._client.rest.download_artifact(self.id, relative.as_posix(), target)
            written.append(target)
        return written

    def cancel(self) -> Job:
        """Cancels the job (its tasks are stopped); returns itself, refreshed. `Conflict` if it had ended."""
        self.raw = self._client.cancel(self.id).raw
        return self
