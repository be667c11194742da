"""Fair share over time: how much of the cluster each team has used lately, in device-seconds per device kind
("gpu", "cpu"), decaying with a half-life (MWMS_FAIR_SHARE_HALF_LIFE_HOURS, 168 by default, as Slurm's
PriorityDecayHalfLife). queue_order.py turns it into each team's standing; this module counts and reads it.

The rules:

- **What counts.** A team's tasks that hold devices (DEVICE_HOLDING_TASK_STATES, LOST ones included until
  their agent confirms they ended), as placement counts them: a GPU task its GPUs, a CPU task one slot.
- **Decay.** A device-second used t seconds ago weighs 0.5 ** (t / half-life). A team's usage is stored as its
  value at `as_of`; read at `now` it is that value × 0.5 ** ((now - as_of) / half-life), so a team that holds
  nothing is never written.
- **Accrual.** One pass at a time (the reconciler's, which runs on one replica: server/live/loops.py) counts
  the interval from the clock (the moment usage is counted up to) to `now`, with the devices held at `now`
  as held throughout it and each second decayed from its own moment:
  held × half-life / ln 2 × (1 - 0.5 ** (dt / half-life)). That is held × dt for an interval short next to
  the half-life, and two passes dt/2 apart add exactly what one pass after dt adds, so the count does not
  depend on how often passes run. The clock moves to `now` in the same transaction: neither a restart nor
  another replica taking the pass over counts an interval twice. An interval across a coordinator restart
  is counted as what was held at its end (the tasks went on running meanwhile, as far as anyone knows).
- **A clock behind** the stored one (a replica whose clock lags, a clock set back) counts nothing and leaves
  the stored clock where it is. The first pass ever only starts the clock.
- **Half-life.** The pass stores the half-life it decays with on the clock, and every reader decays with
  that one, so replicas configured differently still order alike. A changed half-life applies to all
  stored usage from the next pass on.
- **Bounded work.** A pass makes one aggregate query of the device-holding tasks by team and kind, reads and
  writes the rows of the teams that hold devices, and deletes usage last written 40 half-lives ago (less
  than a trillionth of what it was).
- **Coarse for ordering.** read_history rounds each team's usage down to a step of 2 % of (its usage plus
  one device-hour): 72 device-seconds near nothing, 2 % of large usage, and nothing below 0.02 device-hours.
  The scheduler's "same inputs, no new plan" key holds those values (history_key), so usage that grows
  every second does not make every pass plan again, and a team whose past use has decayed to almost
  nothing stands level with one that never ran.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, case, delete, func, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, Task, TeamUsage, UsageClock
from mwms.server.poison import isolated
from mwms.server.services.scheduler.queue_order import HOUR_S, KINDS, shares, standing_hours
from mwms.server.states import DEVICE_HOLDING_TASK_STATES

log = logging.getLogger("mwms.server.fair_share")

CLOCK_ID = 1
PRUNE_AFTER_HALF_LIVES = 40
COARSE_STEP = 1.02  # coarse(): each step 2 % above the one before, in device-hours plus one

# A team -> device kind -> amount mapping, as queue_order takes it.
PerTeam = dict[str, dict[str, float]]


# -- the arithmetic ----------------------------------------------------------------------------------------


def decayed(device_seconds: float, elapsed_s: float, half_life_s: float) -> float:
    """`device_seconds` after `elapsed_s` more seconds of decay (unchanged when elapsed_s <= 0)."""
    if elapsed_s <= 0:
        return device_seconds
    return device_seconds * 0.5 ** (elapsed_s / half_life_s)


def accrued(held: float, elapsed_s: float, half_life_s: float) -> float:
    """What holding `held` devices for the last `elapsed_s` seconds adds now, each second decayed from its
    own moment: held × half-life / ln 2 × (1 - 0.5 ** (elapsed / half-life))."""
    if elapsed_s <= 0 or held <= 0:
        return 0.0
    rate = math.log(2) / half_life_s
    return held * -math.expm1(-rate * elapsed_s) / rate


def coarse(device_seconds: float) -> float:
    """`device_seconds` rounded down to a step of 2 % of (itself + 1 device-hour); 0 below 0.02 device-hours."""
    if not device_seconds > 0:
        return 0.0
    if math.isinf(device_seconds):
        return device_seconds
    step = math.floor(math.log1p(device_seconds / HOUR_S) / math.log(COARSE_STEP))
    return HOUR_S * math.expm1(step * math.log(COARSE_STEP))


# -- accrual (the reconciler's pass) -----------------------------------------------------------------------


def held_devices(session: Session) -> dict[str, dict[str, int]]:
    """Devices each team's tasks hold now, by team then kind: one aggregate query."""
    indices = Task.device_indices
    length: ColumnElement[Any] = func.json_array_length(indices)
    if session.get_bind().dialect.name == "sqlite":  # a damaged row counts no GPU rather than fail the query
        length = case((func.json_valid(indices) == 1, length), else_=0)
    rows = session.execute(
        select(Job.team, Task.device_kind, func.count(), func.sum(length))
        .join(Job, Job.id == Task.job_id)
        .where(Task.state.in_(DEVICE_HOLDING_TASK_STATES))
        .group_by(Job.team, Task.device_kind)
    )
    held: dict[str, dict[str, int]] = {}
    for team, device_kind, tasks, gpus in rows:
        kind = "gpu" if device_kind == "gpu" else "cpu"
        per_team = held.setdefault(team, {})
        per_team[kind] = per_team.get(kind, 0) + (int(gpus or 0) if kind == "gpu" else int(tasks))
    return held


def accrue(session: Session, now: datetime, half_life_s: float) -> None:
    """Counts what every team held from the clock to `now` (the rules are in the module docstring); the
    caller commits. Contained: a failure is logged and counted, and rolls back this alone."""
    with isolated(session, log, "fair_share", "accrue", "fair-share usage"):
        _accrue(session, now, half_life_s)


def _accrue(session: Session, now: datetime, half_life_s: float) -> None:
    if not (math.isfinite(half_life_s) and half_life_s > 0):
        raise ValueError(f"a fair-share half-life must be a positive number of seconds, got {half_life_s!r}")
    clock = session.get(UsageClock, CLOCK_ID)
    if clock is None:
        session.add(UsageClock(id=CLOCK_ID, accrued_to=now, half_life_s=half_life_s))
        session.flush()
        return
    elapsed_s = (now - clock.accrued_to).total_seconds()
    if elapsed_s <= 0:
        return
    holding = {
        (team, kind): amount
        for team, kinds in held_devices(session).items()
        for kind, amount in kinds.items()
        if amount > 0
    }
    if holding:
        rows = {
            (row.team, row.kind): row
            for row in session.scalars(
                select(TeamUsage).where(TeamUsage.team.in_(sorted({team for team, _ in holding})))
            )
        }
        for (team, kind), amount in sorted(holding.items()):
            row = rows.get((team, kind))
            if row is None:
                row = TeamUsage(team=team, kind=kind, device_seconds=0.0, as_of=now)
                session.add(row)
            before = decayed(row.device_seconds, (now - row.as_of).total_seconds(), half_life_s)
            row.device_seconds = before + accrued(amount, elapsed_s, half_life_s)
            row.as_of = now
    forgotten = now - timedelta(seconds=PRUNE_AFTER_HALF_LIVES * half_life_s)
    session.execute(delete(TeamUsage).where(TeamUsage.as_of < forgotten))
    clock.accrued_to, clock.half_life_s = now, half_life_s
    session.flush()


# -- reading -----------------------------------------------------------------------------------------------


def read_usage(session: Session, now: datetime) -> PerTeam:
    """Each team's decayed usage at `now`, in device-seconds by kind (two queries; {} before the first pass)."""
    clock = session.get(UsageClock, CLOCK_ID)
    if clock is None:
        return {}
    usage: PerTeam = {}
    for team, kind, device_seconds, as_of in session.execute(
        select(TeamUsage.team, TeamUsage.kind, TeamUsage.device_seconds, TeamUsage.as_of)
    ):
        value = decayed(device_seconds, (now - as_of).total_seconds(), clock.half_life_s)
        usage.setdefault(team, {})[kind] = value
    return usage


def read_history(session: Session, now: datetime) -> PerTeam:
    """What queue order reads: each team's usage at `now`, coarse (see the module docstring); teams and kinds
    whose coarse usage is 0 are left out."""
    history: PerTeam = {}
    for team, kinds in read_usage(session, now).items():
        for kind, value in kinds.items():
            rounded = coarse(value)
            if rounded > 0:
                history.setdefault(team, {})[kind] = rounded
    return history


def history_key(history: Mapping[str, Mapping[str, float]]) -> Hashable:
    """`history` as part of the scheduler's "same inputs" key."""
    return tuple(
        sorted((team, kind, value) for team, kinds in history.items() for kind, value in kinds.items())
    )


# -- standings (what people see) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamStanding:
    """A team's decayed usage (device-seconds by kind), its share now (devices by kind) and its standing:
    the hours of its whole share its usage amounts to (queue_order.standing_hours)."""

    usage: dict[str, float]
    share: dict[str, float]
    standing: float


def standings(
    usage: Mapping[str, Mapping[str, float]],
    teams: Iterable[str],
    active: Iterable[str],
    totals: Mapping[str, int],
    quotas: Mapping[str, Mapping[str, int | None]],
) -> dict[str, TeamStanding]:
    """The standing of each of `teams`, with its share as queue order gives it: its quota, else an even part of
    `totals` among the `active` teams (those that run or wait) and, for a team that does neither, itself too:
    what it would stand at if it submitted now."""
    active = sorted(set(active))
    among = shares(active, totals, quotas)
    result = {}
    for team in sorted(set(teams)):
        share = among[team] if team in among else shares([*active, team], totals, quotas)[team]
        used = {kind: float(usage.get(team, {}).get(kind, 0.0)) for kind in KINDS}
        result[team] = TeamStanding(usage=used, share=share, standing=standing_hours(used, share))
    return result
