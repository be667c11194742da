"""A job of the fake API: FakeJob answers its summary (JobSummary), details (JobOut) and queue row (QueueEntry)
as plain dicts that the routes' response models check.

What is not set explicitly is told as a story from its state: tasks on gpu-node-1 and gpu-node-2, an
attempt history whose earlier attempts failed, and the events PENDING -> SCHEDULED -> RUNNING. `ending` says
how each attempt ended; a test's subclass may tell other stories (override `ending` or post-process `detail`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from mwms.server.schemas import AttemptEndingOut

# An hour ago, so durations and "ago" times in screenshots look like a live cluster's.
T0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
ENDED_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
WAITING_STATES = ("PENDING", "RESTARTING", "PREEMPTING")
FAILED_ATTEMPT_REASON = "task 1 was killed by signal 9 (SIGKILL); restarting; last lines:\n" + "\n".join(
    f"I0000 worker log line {i} <tag> " + "x" * 80 for i in range(12)
)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def now() -> datetime:
    return datetime.now(timezone.utc)


def default_spec() -> dict[str, Any]:
    """What a job was submitted with (JobOut's fields beyond JobSummary's), unless a test says otherwise."""
    return {
        "command": ["python", "train.py", "--epochs", "3", "--note", "it's quoted"],
        "bundle_digest": "ab" * 32,
        "env_names": ["WANDB_MODE", "DATA_DIR"],
        "communication": {"implementation": "NCCL", "timeout_seconds": 600.0, "bytes_per_pack": 33554432},
        "restart": {"max_restarts": 3, "restart_on": "retryable"},
        "startup_timeout_seconds": 300.0,
        "max_runtime_seconds": None,
    }


def fake_task(
    job_id: str,
    index: int,
    *,
    attempt: int,
    state: str,
    agent: str,
    started_at: datetime | None,
    exit_code: int | None = None,
    workers: int = 2,
    **overrides: Any,
) -> dict[str, Any]:
    """A task as the coordinator answers it (schemas.TaskOut, every field); `overrides` replace its fields."""
    addresses = [f"10.0.0.{i + 11}:4{i}001" for i in range(workers)]
    cluster = ", ".join(f'"{address}"' for address in addresses)
    return {
        "id": f"{job_id}-a{attempt}-t{index}",
        "index": index,
        "attempt": attempt,
        "agent_id": f"agent-{index + 1}",
        "agent_name": agent,
        "address": addresses[index],
        "state": state,
        "exit_code": exit_code,
        "message": "exited with code 0" if exit_code == 0 else "",
        "pid": 4100 + index if exit_code is None else None,
        "device_kind": "gpu",
        "device_indices": [index],
        "device_uuids": [],
        "tf_config": f'{{"cluster": {{"worker": [{cluster}]}}, "task": {{"type": "worker", "index": {index}}}}}',
        "started_at": _iso(started_at),
        "ended_at": _iso(started_at + timedelta(minutes=9)) if exit_code is not None and started_at else None,
        "environment": "",
        "environment_build_seconds": None,
        # Worker 0 reported its peak memory (1.2 GiB), worker 1 only the limit its agent applied.
        "peak_memory_bytes": 1288490188 if index == 0 else None,
        "memory_limit_bytes": 8 * 2**30,
        "ended_attempt": False,
        **overrides,
    }


def attempt_ending(kind: str, message: str, details: dict[str, Any] | None = None, **actors: Any) -> dict:
    """An attempt's `ended` as the coordinator answers it (schemas.AttemptEndingOut): every actor field,
    null where the kind has none."""
    unknown = set(actors) - set(AttemptEndingOut.model_fields)
    assert not unknown, f"not fields of AttemptEndingOut: {unknown}"
    ending = AttemptEndingOut(kind=kind, message=message, details=details or {}, **actors)
    return ending.model_dump(mode="json")


def state_event(source: str | None, to: str, reason: str, at: datetime, **cause: str) -> dict[str, Any]:
    """A change of state (schemas.JobEventOut; with a cause: AttemptEventOut)."""
    return {"from_state": source, "to_state": to, "reason": reason, "at": _iso(at), **cause}


def attempt_events(state: str, created: datetime, ended: datetime | None, cause: str) -> list[dict]:
    """An attempt's events: placed (ACTIVE), then its ending with the ending's kind as cause."""
    events = [state_event(None, "ACTIVE", "placing", created, cause="")]
    if ended is not None:
        events.append(state_event("ACTIVE", state, "", ended, cause=cause))
    return events


@dataclass
class FakeJob:
    """A job; tests set its fields (state, metrics, logs, waiting, ...) and the routes answer from them."""

    id: str
    name: str
    state: str
    created_at: datetime
    attempts: int = 1
    # The dashboard's job lists advance it: RUNNING turns SUCCEEDED once listed this many times.
    finish_after_polls: int | None = None
    polls: int = 0
    metrics: list[dict] = field(default_factory=list)
    logs: list[dict] = field(default_factory=list)
    reason: str = ""
    submitted_by: str = "alice"
    cancelled_by: str = ""
    team: str = "vision"
    priority: int = 500
    preemptible: bool = True
    waiting: dict[str, Any] = field(default_factory=dict)
    # The queue row's estimated start for people and its basis (server/services/scheduler/start_estimates.py).
    estimated_start: datetime | None = None
    estimate_basis: str = "unknown"
    workers: int = 2
    gpus_per_worker: int = 1
    spec: dict[str, Any] = field(default_factory=default_spec)
    # Set explicitly, these replace the story told from `state`.
    tasks: list[dict[str, Any]] | None = None
    events: list[dict[str, Any]] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def progress(self) -> tuple[int | None, float | str | None]:
        """The summary's step and loss: the newest loss point's."""
        last_loss = next((p for p in reversed(self.metrics) if p["name"] == "loss"), None)
        return (last_loss["step"], last_loss["value"]) if last_loss else (None, None)

    def summary(self) -> dict[str, Any]:
        step, loss = self.progress()
        started = self.started_at or (
            self.created_at + timedelta(seconds=5) if self.state != "PENDING" else None
        )
        finished = self.finished_at or (
            self.created_at + timedelta(minutes=9) if self.state in ENDED_STATES else None
        )
        kept = ("id", "name", "state", "reason", "workers", "gpus_per_worker", "attempts", "submitted_by")
        return {
            **{key: getattr(self, key) for key in (*kept, "cancelled_by", "team", "priority", "preemptible")},
            **{key: self.spec.get(key) for key in ("memory_per_worker", "cpus_per_worker")},
            "created_at": _iso(self.created_at),
            "started_at": _iso(started),
            "finished_at": _iso(finished),
            "restarts": max(self.attempts - 1, 0),
            "step": step,
            "loss": loss,
            "waiting": self.waiting if self.state in WAITING_STATES else {},
        }

    def queue_row(self, position: int) -> dict[str, Any]:
        """This job as GET /api/v1/queue lists it."""
        summary = self.summary()
        fields = ("name", "state", "team", "submitted_by", "priority", "workers", "gpus_per_worker")
        return {
            "position": position,
            "job_id": self.id,
            **{key: summary[key] for key in (*fields, "preemptible", "created_at", "memory_per_worker")},
            "waiting": self.waiting,
            "estimated_start": _iso(self.estimated_start),
            "estimate_basis": self.estimate_basis,
        }

    def ending(self, number: int, state: str) -> dict[str, Any]:
        """How attempt `number` ended (its `ended`), as the coordinator words it."""
        if state == "FAILED":
            return attempt_ending(
                "task_failed",
                "task 1 failed on agent gpu-node-2: exit code 137 (SIGKILL); restart 1 of 3",
                task=1,
                agent="gpu-node-2",
                agent_id="agent-2",
                exit_code=137,
                restart=number,
                restart_cause="signal",
            )
        if state == "CANCELLED":
            by = self.cancelled_by
            return attempt_ending("cancelled", f"cancelled by {by}" if by else "cancelled", by=by)
        return attempt_ending("succeeded", "succeeded: every task exited 0")

    def told_tasks(self) -> list[dict[str, Any]]:
        """The newest attempt's tasks as the story tells them: none while PENDING."""
        task_state = {"SUCCEEDED": "SUCCEEDED", "CANCELLED": "STOPPED", "PENDING": None}.get(
            self.state, "RUNNING"
        )
        if task_state is None:
            return []
        exit_code = 0 if self.state == "SUCCEEDED" else (-15 if self.state == "CANCELLED" else None)
        started = self.created_at + timedelta(minutes=3 * (self.attempts - 1), seconds=20)
        return [
            fake_task(
                self.id,
                i,
                attempt=self.attempts,
                state=task_state,
                agent=f"gpu-node-{i + 1}",
                started_at=started,
                exit_code=exit_code,
                workers=self.workers,
            )
            for i in range(self.workers)
        ]

    def attempt_history(self, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # As the story was first told: the newest attempt is ACTIVE unless the job SUCCEEDED, was
        # CANCELLED or waits; explicitly set tasks end it when the job ends.
        ended_states = ("SUCCEEDED", "CANCELLED", "PENDING") if self.tasks is None else ENDED_STATES
        running = self.state not in ended_states
        history = []
        for number in range(1, self.attempts + 1):
            newest = number == self.attempts
            state = ("ACTIVE" if running else self.state) if newest else "FAILED"
            created = self.created_at + timedelta(minutes=3 * (number - 1))
            ended = None if state == "ACTIVE" else self.created_at + timedelta(minutes=3 * number)
            history.append(
                {
                    "number": number,
                    "state": state,
                    "reason": "" if newest else FAILED_ATTEMPT_REASON,
                    "created_at": _iso(created),
                    "ended_at": _iso(ended),
                    "tasks": tasks,
                    "ended": None if ended is None else self.ending(number, state),
                    "events": attempt_events(state, created, ended, self.ending(number, state)["kind"]),
                }
            )
        return history

    def told_events(self) -> list[dict[str, Any]]:
        created, placed = self.created_at, "placed on gpu-node-1, gpu-node-2"
        events = [
            state_event(None, "PENDING", "submitted", created),
            state_event("PENDING", "SCHEDULED", placed, created + timedelta(seconds=2)),
            state_event("SCHEDULED", "RUNNING", "all 2 tasks running", created + timedelta(seconds=5)),
        ]
        if self.state in ("SUCCEEDED", "CANCELLED"):
            reason = self.reason or "all tasks exited 0"
            events.append(state_event("RUNNING", self.state, reason, created + timedelta(minutes=9)))
        return events

    def detail(self) -> dict[str, Any]:
        """The job as GET /api/v1/jobs/{id} answers it (schemas.JobOut)."""
        tasks = self.told_tasks() if self.tasks is None else self.tasks
        return {
            **self.summary(),
            **self.spec,
            "tasks": tasks,
            "latest_stacks": None,
            "attempt_history": self.attempt_history(tasks),
            "events": self.told_events() if self.events is None else self.events,
        }

    def read(self, state: Any) -> None:
        """Called before GET /api/v1/jobs/{id} answers; a scripted job takes its next step here."""
