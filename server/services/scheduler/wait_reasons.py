"""Why a waiting job waits, typed: what the API's `waiting`, `mwms queue` and the dashboard show.

Each reason is a dict: `kind` (below), `message` (one line a person can act on, also the job's
`reason`), `estimated_start` (ISO time when the reservation plan gives one, else None), and the
details of its kind.

- over_quota: team, unit, need, in_use, quota, borrowable (a preemptible job borrows idle capacity)
- no_fit: need (workers), per_worker, unit; memory_per_worker (bytes) when the job asks for memory, and
  short_of "memory" when the free devices would hold it but the agents' free memory does not; the queue
  view adds fits_now (such workers that fit now)
- reserved: for_job (the reserved job at the head of the order), starts when it starts
- head: this job holds the reservation; estimated_start when running jobs' max_runtime tell
- behind_priority: for_job (a higher-priority job the capacity is held for while its victims exit)
- preempting: this job preempted `victims` and waits for them to exit
- cordoned: only cordoned agents could hold it
- connecting: it fits once agents that are online but have not connected their stream yet have (agents)
- pinned: the agents the job names are offline or busy
- backoff / preempted: a RESTARTING or PREEMPTING job, not placeable yet
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from mwms.server.services.scheduler.queue_order import WaitingJob
from mwms.server.services.wording import count
from mwms.sizes import format_size


def _unit(job: WaitingJob) -> str:
    return "GPU" if job.kind == "gpu" else "CPU slot"


def _reason(
    kind: str, message: str, estimated_start: datetime | None = None, **details: Any
) -> dict[str, Any]:
    return {
        "kind": kind,
        "message": message,
        "estimated_start": estimated_start.isoformat() if estimated_start is not None else None,
        **details,
    }


def _shape(job: WaitingJob) -> str:
    memory = f" with {format_size(job.memory_per_worker)} each" if job.memory_per_worker > 0 else ""
    return f"{count(job.workers, 'worker')} × {count(job.per_worker, _unit(job))}{memory}"


def not_placeable(state: str) -> dict[str, Any]:
    if state == "PREEMPTING":
        return _reason("preempted", "preempted: waiting for its workers to save and exit")
    return _reason("backoff", "restarting: waiting for its backoff and for its old tasks to end")


def over_quota(job: WaitingJob, in_use: int, quota: int, borrowable: bool) -> dict[str, Any]:
    unit = _unit(job)
    tail = (
        "it borrows idle capacity when some is free (preemptible)"
        if borrowable
        else "a non-preemptible job never borrows: submit it preemptible, or ask an admin for more quota"
    )
    return _reason(
        "over_quota",
        f"over team {job.team!r}'s quota: needs {count(job.need, unit)}, the team uses {in_use} of its "
        f"{quota}; it starts when the team's jobs finish, or {tail}",
        team=job.team,
        unit=unit,
        need=job.need,
        in_use=in_use,
        quota=quota,
        borrowable=borrowable,
    )


def no_fit(job: WaitingJob, never: str, short_of_memory: bool = False) -> dict[str, Any]:
    """Nothing frees for it soon enough to reserve (or it can never fit: `never` says why); with
    `short_of_memory`, the free devices would hold it but the memory the agents have left would not.

    How many such workers fit now is not part of the stored reason (it changes with every placement, and
    rewriting thousands of reasons for it would cost a pass its time): the queue view adds it live.
    """
    if never:
        message = never
    elif short_of_memory:
        message = (
            f"waiting for memory: needs {_shape(job)}; the agents with free {_unit(job)}s have too little "
            "memory left for it (promised to running tasks); it starts when running jobs finish or agents join"
        )
    else:
        message = (
            f"waiting for capacity: needs {_shape(job)}; it starts when running jobs finish or agents join"
        )
    memory: dict[str, Any] = {"memory_per_worker": job.memory_per_worker} if job.memory_per_worker > 0 else {}
    if short_of_memory:
        memory["short_of"] = "memory"
    return _reason("no_fit", message, need=job.workers, per_worker=job.per_worker, unit=_unit(job), **memory)


def reserved_head(job: WaitingJob, starts_at: datetime | None) -> dict[str, Any]:
    when = (
        f"about {starts_at.isoformat(timespec='seconds')} (running jobs' max_runtime)"
        if starts_at is not None
        else "when running jobs without a max_runtime finish"
    )
    return _reason(
        "head",
        f"first in line: needs {_shape(job)}; the devices that free soonest are reserved for it, it starts "
        f"{when}",
        starts_at,
    )


def reserved_for(job: WaitingJob, head: str) -> dict[str, Any]:
    return _reason(
        "reserved",
        f"the capacity it would fit on is reserved for job {head}, first in line; jobs with a max_runtime "
        "that ends before that job starts may use it",
        for_job=head,
    )


def behind_priority(job: WaitingJob, preemptor: str) -> dict[str, Any]:
    return _reason(
        "behind_priority",
        f"the free capacity is held for job {preemptor}, which preempted jobs and waits for them to exit",
        for_job=preemptor,
    )


def preempting_for(job: WaitingJob, victims: list[str] | None = None) -> dict[str, Any]:
    named = f" ({', '.join(victims)})" if victims else ""
    return _reason(
        "preempting",
        f"preempting lower-priority or borrowed jobs{named}: it starts once their workers have saved and "
        "exited; the capacity is held for it meanwhile",
        victims=victims or [],
    )


def cordoned(job: WaitingJob) -> dict[str, Any]:
    return _reason(
        "cordoned",
        f"needs {_shape(job)}: only cordoned agents could hold it (`mwms agent uncordon`, or add agents)",
    )


def connecting(job: WaitingJob, agents: list[str]) -> dict[str, Any]:
    """Online agents that could hold it have registered but not connected yet (it starts once they have)."""
    names = ", ".join(agents[:5]) + (f" and {len(agents) - 5} more" if len(agents) > 5 else "")
    return _reason(
        "connecting",
        f"needs {_shape(job)}: waiting for {count(len(agents), 'agent')} that came online to connect "
        f"({names}); it starts once they have",
        agents=agents[:50],
    )


def pinned(message: str) -> dict[str, Any]:
    return _reason("pinned", message)
