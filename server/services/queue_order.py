"""The order waiting jobs are considered in: priority, then their team's fair share, then age.

Pure functions over plain data (server/services/queue_plan.py builds the data), so the rules are tested
without a database. Fair share is dominant-resource share: a team's use of each device kind divided
by its share of that kind (its quota when it has one, else an equal part of the cluster among the
teams that run or wait), the larger of the two. Within one priority band the team furthest below its
share goes next; as each job is taken its team's use grows by what the job needs, as if it were
placed, so a team with many waiting jobs takes turns with the others instead of going first for all.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mwms.server.services.placement import devices_needed

KINDS = ("gpu", "cpu")


@dataclass(slots=True)
class WaitingJob:
    """A job that waits to be placed (PENDING), or waits for that (RESTARTING, PREEMPTING).

    A plain slotted dataclass: a pass builds one per waiting job, thousands of them, and reads its
    shape (kind, per_worker, need) many times, so those are computed once here.
    """

    job_id: str
    state: str
    priority: int
    team: str
    created_at: datetime
    workers: int
    gpus_per_worker: int
    preemptible: bool = True
    pinned: tuple[str, ...] | None = None
    max_runtime_s: float | None = None
    # Capacity held for it while the jobs it preempted exit: {agent_id: device indices}.
    hold: Mapping[str, tuple[int, ...]] | None = None
    # Bytes of memory each worker asks for (0: none), counted against each agent's memory at placement.
    memory_per_worker: int = 0
    # Its stored reason text, so a pass writes only the reasons that changed.
    stored_reason: Any = field(default=None, compare=False)
    kind: str = field(init=False, compare=False)  # "gpu" or "cpu"
    per_worker: int = field(init=False, compare=False)  # devices one worker takes
    need: int = field(init=False, compare=False)  # devices of its kind the whole gang takes

    def __post_init__(self) -> None:
        self.kind, self.per_worker = devices_needed(self.gpus_per_worker)
        self.need = self.workers * self.per_worker


def shares(
    teams: Iterable[str], totals: Mapping[str, int], quotas: Mapping[str, Mapping[str, int | None]]
) -> dict[str, dict[str, float]]:
    """Each team's share of each kind: its quota, else the cluster's devices split evenly among `teams`."""
    names = sorted(set(teams))
    even = {kind: totals.get(kind, 0) / max(1, len(names)) for kind in KINDS}
    result: dict[str, dict[str, float]] = {}
    for team in names:
        quota = quotas.get(team, {})
        result[team] = {
            kind: float(quota[kind]) if quota.get(kind) is not None else even[kind]  # type: ignore[arg-type]
            for kind in KINDS
        }
    return result


def share_ratio(used: Mapping[str, int], share: Mapping[str, float]) -> float:
    """Dominant share: the largest use/share over device kinds (0 when the team uses nothing)."""
    ratio = 0.0
    for kind in KINDS:
        amount = used.get(kind, 0)
        if amount <= 0:
            continue
        part = share.get(kind, 0.0)
        ratio = max(ratio, amount / part if part > 0 else float("inf"))
    return ratio


def queue_order(
    waiting: Iterable[WaitingJob],
    usage: Mapping[str, Mapping[str, int]],
    totals: Mapping[str, int],
    quotas: Mapping[str, Mapping[str, int | None]],
) -> list[WaitingJob]:
    """Every waiting job in the order the scheduler considers them (see the module docstring)."""
    jobs = list(waiting)
    team_shares = shares([j.team for j in jobs] + list(usage), totals, quotas)
    projected = {team: dict(used) for team, used in usage.items()}
    bands: dict[int, dict[str, list[WaitingJob]]] = {}
    for job in sorted(jobs, key=lambda j: (j.created_at, j.job_id), reverse=True):
        bands.setdefault(job.priority, {}).setdefault(job.team, []).append(job)  # oldest last: pop()
    ordered: list[WaitingJob] = []
    for priority in sorted(bands, reverse=True):
        per_team = bands[priority]
        heap = [
            (share_ratio(projected.get(team, {}), team_shares[team]), q[-1].created_at, q[-1].job_id, team)
            for team, q in per_team.items()
        ]
        heapq.heapify(heap)
        while heap:
            _, _, _, team = heap[0]
            queue = per_team[team]
            job = queue.pop()
            ordered.append(job)
            used = projected.setdefault(team, {})
            used[job.kind] = used.get(job.kind, 0) + job.need
            if queue:
                head = queue[-1]
                ratio = share_ratio(used, team_shares[team])
                heapq.heapreplace(heap, (ratio, head.created_at, head.job_id, team))
            else:
                heapq.heappop(heap)
    return ordered
