"""The order waiting jobs are considered in: priority, then their team's fair share, then age.

Pure functions over plain data (server/services/scheduler/scheduling.py reads the data), so the rules are tested
without a database. Within one priority band the team with the lowest fair-share key goes next, its
oldest job first; ties go to the older job. A team's key is its standing plus its dominant share now:

- **Share**: of each device kind, its quota when it has one, else an equal part of the cluster's devices
  among the teams that run or wait.
- **Standing**: its past use, decayed with the half-life (server/services/scheduler/fair_share.py, the `history`
  argument), over its share, in hours of its whole share: a team that held all of its share for the last
  hour stands at about 1, twice its share for ten hours at about 20 (less its decay). The larger over
  device kinds; a kind it has no share of (no such devices online, a quota of 0) does not count.
- **Dominant share now**: what it holds, over its share, the larger over device kinds (infinite when it
  holds a kind it has no share of). Added to the standing as it is, so what a team holds now weighs as
  much as the next hour of holding it would add to its standing: a team that has just taken the cluster
  stops going first at once, and the past (a half-life of days) still outweighs the moment.
- **Turns**: as each job is taken its team's holding grows by what the job needs, as if it were placed,
  so teams with many waiting jobs take turns instead of one going first for all; a team far below the
  others in standing goes first until its projected holding makes up the difference.

With no history (a new cluster, or past use decayed below 0.02 device-hours: fair_share.coarse) the key
is the dominant share now alone: fair share by current use.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mwms.server.services.scheduler.placement import devices_needed

KINDS = ("gpu", "cpu")
HOUR_S = 3600.0
INFINITY = float("inf")


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
    # What a pass's fit for it depends on besides the pass's state: jobs alike in it fare alike.
    fit: tuple[Any, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        self.kind, self.per_worker = devices_needed(self.gpus_per_worker)
        self.need = self.workers * self.per_worker
        self.fit = (self.kind, self.per_worker, self.workers, self.memory_per_worker, self.max_runtime_s)


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
        value = amount / part if part > 0 else INFINITY
        if value > ratio:
            ratio = value
    return ratio


def standing_hours(history: Mapping[str, float], share: Mapping[str, float]) -> float:
    """Past use (device-seconds, decayed) over share, in hours of the whole share: the largest over device
    kinds the team has a share of (0 without history)."""
    hours = 0.0
    for kind in KINDS:
        part = share.get(kind, 0.0)
        used = history.get(kind, 0.0)
        if part > 0 and used > 0:
            hours = max(hours, used / (part * HOUR_S))
    return hours


# One team's jobs in the order it takes its turns, each with the key it is taken at: (-priority, key,
# created_at, job_id, job), increasing. A team's run depends on its own jobs, use, share and standing only.
Run = list[tuple[int, float, datetime, str, WaitingJob]]
# What queue_order keeps between calls when given one: per team, what its run was built from, and the run.
TeamRuns = dict[str, tuple[tuple[Any, ...], list[WaitingJob], Run]]


def queue_order(
    waiting: Iterable[WaitingJob],
    usage: Mapping[str, Mapping[str, int]],
    totals: Mapping[str, int],
    quotas: Mapping[str, Mapping[str, int | None]],
    history: Mapping[str, Mapping[str, float]] | None = None,
    memo: TeamRuns | None = None,
) -> list[WaitingJob]:
    """Every waiting job in the order the scheduler considers them (see the module docstring).

    `usage`: devices each team holds now; `history`: each team's decayed past use in device-seconds, by
    team then kind (fair_share.read_history), taken as it is. `memo` (the scheduler's, kept between
    passes): each team's run by what it was built from, so a pass orders again only the teams whose jobs,
    use, share or standing changed (a placed gang changes one team's).

    Turns as a merge: within a band a team's key only grows as its jobs are taken, and later bands start
    from what it took in earlier ones, so each team's run is increasing and taking the lowest head of all
    teams' runs, one job at a time, is sorting their union."""
    per_team: dict[str, list[WaitingJob]] = {}
    for job in waiting:  # in the order given: a team's list changes only when its jobs do
        per_team.setdefault(job.team, []).append(job)
    team_shares = shares([*per_team, *usage], totals, quotas)
    history = history or {}
    merged: Run = []
    kept: TeamRuns = {}
    for team, given in per_team.items():
        share = team_shares[team]
        standing = standing_hours(history.get(team, {}), share)
        used = usage.get(team, {})
        built_from = (standing, tuple(share.items()), tuple(sorted(used.items())))
        cached = memo.get(team) if memo is not None else None
        if cached is not None and cached[0] == built_from and _same_jobs(cached[1], given):
            run = cached[2]
        else:
            queue = sorted(given, key=_age)
            queue.sort(key=_priority, reverse=True)  # stable: oldest first within a priority
            run = _run(queue, standing, used, share)
        kept[team] = (built_from, given, run)
        merged += run
    if memo is not None:
        memo.clear()
        memo.update(kept)
    merged.sort()  # the runs are sorted already: this merges them
    return [entry[4] for entry in merged]


def _age(job: WaitingJob) -> tuple[datetime, str]:
    return job.created_at, job.job_id


def _priority(job: WaitingJob) -> int:
    return job.priority


def _same_jobs(before: list[WaitingJob], now: list[WaitingJob]) -> bool:
    """The same job objects (a job read again is a new object, even when equal: its stored reason may
    differ, and the order hands out these objects)."""
    return len(before) == len(now) and all(map(operator.is_, before, now))


def _run(
    queue: list[WaitingJob], standing: float, used: Mapping[str, int], share: Mapping[str, float]
) -> Run:
    """The team's jobs (by priority, then age) with the key each is taken at: its holding grows by what
    each job needs, as if it were placed (Turns)."""
    projected = dict(used)
    run: Run = []
    append = run.append
    for job in queue:
        append((-job.priority, standing + share_ratio(projected, share), job.created_at, job.job_id, job))
        projected[job.kind] = projected.get(job.kind, 0) + job.need
    return run
