"""Device telemetry from agents: which samples are refused, the newest sample per device, storage, retention.

Agents with GPUs send a sample of every GPU every few seconds (worker_agent/device_telemetry.py). Each sample
is checked on its own (`sample_problem`): a finite utilisation in [0, 100] %, memory within the column's
range and used <= total, a finite temperature in [0, MAX_TEMPERATURE_C], and a device index the agent
registered as a GPU. Refused samples are counted (mwms_poison_total{kind="device_sample"} and per agent);
the rest are kept as the newest per device in memory (`LatestSamples`, for the agents page) and written
in batches by server/live/device_ingest.py, stamped with the time the coordinator received them, so an
agent's clock never places a sample outside its task's window.

Reading them back (`newest_readings`): the replica holding an agent's stream has its newest samples in
memory; on PostgreSQL, where several replicas share the database, the agents whose streams other replicas
hold (or none does) are read from the table instead (`stored_newest`): the newest sample per device within
the last READINGS_WINDOW, in one query whatever the number of agents.

Retention: samples older than MWMS_DEVICE_SAMPLE_RETENTION_HOURS (and never longer than
MWMS_TELEMETRY_RETENTION_DAYS) are deleted agent by agent in bounded batches (`purge_before`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, insert, select, true
from sqlalchemy.orm import Session
from sqlalchemy.sql import FromClause

from mwms.agent_link import MAX_DEVICES_PER_MESSAGE
from mwms.server.db.models import Agent, DeviceSample, utcnow

# The memory columns are 32-bit integers on PostgreSQL; 2**31 MiB is 2 PiB, far above any device.
MAX_MEMORY_MIB = 2**31 - 1
MAX_TEMPERATURE_C = 200.0
PURGE_ROWS = 5000  # rows deleted per agent per transaction
PURGE_AGENTS = 100  # agents per purge transaction
# How far back `stored_newest` looks: 12 samples at the agents' default interval
# (mwms/agent_defaults.py DEVICE_SAMPLE_INTERVAL_S, 5 s; `--device-sample-interval`), so a sample or two
# lost, or a flush a second late, still shows. An agent sampling less often than this shows no readings
# through a replica that does not hold its stream. Longer costs more: every sample in it is read.
READINGS_WINDOW = timedelta(seconds=60)


@dataclass(frozen=True)
class IncomingSample:
    """One device's sample as an agent sent it."""

    index: int
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float


@dataclass(frozen=True)
class LatestSample:
    """The newest accepted sample of one device, with the time the coordinator received it."""

    index: int
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float
    at: datetime


def _finite_within(value: float, low: float, high: float) -> bool:
    return math.isfinite(value) and low <= value <= high


def sample_problem(sample: IncomingSample, gpu_indices: frozenset[int]) -> str | None:
    """Why the coordinator refuses `sample` from an agent whose registered GPUs are `gpu_indices`, or None."""
    if sample.index not in gpu_indices:
        known = ", ".join(map(str, sorted(gpu_indices))) or "none"
        return f"device {sample.index} is not a GPU the agent registered (its GPUs: {known})"
    if not _finite_within(sample.utilization_pct, 0.0, 100.0):
        return f"utilization {sample.utilization_pct!r} % is not a number in [0, 100]"
    if not 0 <= sample.memory_total_mib <= MAX_MEMORY_MIB:
        return f"memory total {sample.memory_total_mib} MiB is outside [0, {MAX_MEMORY_MIB}]"
    if not 0 <= sample.memory_used_mib <= sample.memory_total_mib:
        return f"memory used {sample.memory_used_mib} MiB is outside [0, total {sample.memory_total_mib}]"
    if not _finite_within(sample.temperature_c, 0.0, MAX_TEMPERATURE_C):
        return f"temperature {sample.temperature_c!r} °C is not a number in [0, {MAX_TEMPERATURE_C:.0f}]"
    return None


@dataclass(frozen=True)
class Checked:
    """A message's samples split into the accepted ones and the number refused, with the first reason."""

    accepted: list[IncomingSample]
    refused: int
    reason: str


def check_samples(samples: list[IncomingSample], gpu_indices: frozenset[int]) -> Checked:
    """Accepts at most MAX_DEVICES_PER_MESSAGE samples, each index once, each within bounds."""
    accepted: list[IncomingSample] = []
    seen: set[int] = set()
    refused, reason = 0, ""
    for position, sample in enumerate(samples):
        if position >= MAX_DEVICES_PER_MESSAGE:
            problem: str | None = f"more than {MAX_DEVICES_PER_MESSAGE} devices in one message"
        elif sample.index in seen:
            problem = f"device {sample.index} appears twice in one message"
        else:
            problem = sample_problem(sample, gpu_indices)
        if problem is None:
            seen.add(sample.index)
            accepted.append(sample)
        else:
            refused += 1
            reason = reason or problem
    return Checked(accepted, refused, reason)


class LatestSamples:
    """The newest sample of every device of every agent, and how many samples each agent had refused.

    Memory only (a restarted coordinator starts empty and fills within one sample interval); bounded by
    the agents that registered times MAX_DEVICES_PER_MESSAGE. Used from the event loop and read by API
    threads: every update replaces a whole per-agent dict, so a reader never sees one half-written.
    """

    def __init__(self) -> None:
        self._latest: dict[str, dict[int, LatestSample]] = {}
        self._refused: dict[str, int] = {}

    def put(self, agent_id: str, samples: list[IncomingSample], at: datetime) -> None:
        devices = dict(self._latest.get(agent_id, {}))
        for s in samples:
            devices[s.index] = LatestSample(
                s.index, s.utilization_pct, s.memory_used_mib, s.memory_total_mib, s.temperature_c, at
            )
        self._latest[agent_id] = devices

    def count_refused(self, agent_id: str, refused: int) -> None:
        self._refused[agent_id] = self._refused.get(agent_id, 0) + refused

    def forget(self, agent_id: str) -> None:
        """Drops what is known of an agent (whose registered devices changed)."""
        self._latest.pop(agent_id, None)

    def of(self, agent_id: str) -> list[LatestSample]:
        """The agent's devices' newest samples, by index."""
        return sorted(self._latest.get(agent_id, {}).values(), key=lambda s: s.index)

    def refused(self, agent_id: str) -> int:
        return self._refused.get(agent_id, 0)

    def agents(self) -> list[str]:
        return sorted(self._latest)


def stored_newest(
    session: Session,
    since: datetime,
    *,
    not_held_by: str | None = None,
    agent_id: str | None = None,
) -> dict[str, list[LatestSample]]:
    """The newest stored sample of each device of each agent, among those received at or after `since`,
    by agent id, each agent's by device index; one query whatever the number of agents.

    `not_held_by`: leave out the agents whose stream that replica holds (it has them in memory);
    `agent_id`: that agent only. Agents with no sample since `since` are absent.
    """
    agents = select(Agent.id)
    if not_held_by is not None:
        agents = agents.where(Agent.stream_replica.is_distinct_from(not_held_by))
    if agent_id is not None:
        agents = agents.where(Agent.id == agent_id)
    columns = (
        DeviceSample.device_index,
        DeviceSample.utilization_pct,
        DeviceSample.memory_used_mib,
        DeviceSample.memory_total_mib,
        DeviceSample.temperature_c,
        DeviceSample.at,
    )
    rank = func.row_number().over(
        partition_by=(DeviceSample.agent_id, DeviceSample.device_index),
        order_by=(DeviceSample.at.desc(), DeviceSample.id.desc()),
    )
    recent = select(*columns, rank.label("rank")).where(DeviceSample.at >= since)
    newest: FromClause
    if session.get_bind().dialect.name == "postgresql":
        # LATERAL: each agent's own range of ix_device_samples_agent_at (agent_id = a.id AND at >= since),
        # about 100 rows at 8 GPUs every 5 s, whatever else the retention holds. The window function keeps
        # the planner from flattening it into one scan of the table for `at >= since`, which the index
        # cannot serve (measured: a plain join read every row of the table, 3 M rows for 30 minutes).
        newest = recent.where(DeviceSample.agent_id == Agent.id).lateral()
        query = agents.join(newest, true())
    else:
        # SQLite, one coordinator, reads memory instead (newest_readings); this form serves tests and tools.
        newest = recent.add_columns(DeviceSample.agent_id).subquery()
        query = agents.join(newest, newest.c.agent_id == Agent.id)
    query = (
        query.add_columns(*(newest.c[c.key] for c in columns))
        .where(newest.c.rank == 1)
        .order_by(Agent.id, newest.c.device_index)
    )
    found: dict[str, list[LatestSample]] = {}
    for row in session.execute(query):
        found.setdefault(row.id, []).append(
            LatestSample(
                row.device_index,
                row.utilization_pct,
                row.memory_used_mib,
                row.memory_total_mib,
                row.temperature_c,
                row.at,
            )
        )
    return found


def newest_readings(
    session: Session,
    latest: LatestSamples,
    replica_id: str,
    *,
    agent_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, list[LatestSample]]:
    """The newest sample of every device of every agent (or of `agent_id` only), by agent id, whichever
    replica holds its stream.

    From memory (`latest`) for the agents whose stream this replica holds; on PostgreSQL, the others from
    the table (`stored_newest` over READINGS_WINDOW), and from memory only when the table has none of theirs
    that recent (an agent this replica heard before it went away). On SQLite there is one coordinator,
    whose memory holds every agent: the table is not read. Refused-sample counts are memory only
    (`LatestSamples.refused`): they are not stored, so a replica counts only the streams it held.
    """
    agents = latest.agents() if agent_id is None else [agent_id]
    readings = {a: devices for a in agents if (devices := latest.of(a))}
    if session.get_bind().dialect.name == "sqlite":
        return readings
    since = (now or utcnow()) - READINGS_WINDOW
    readings.update(stored_newest(session, since, not_held_by=replica_id, agent_id=agent_id))
    return dict(sorted(readings.items()))


def registered_gpu_indices(session: Session, agent_id: str) -> frozenset[int]:
    """The indices of the GPUs the agent registered (none for an unknown agent)."""
    agent = session.get(Agent, agent_id)
    if agent is None:
        return frozenset()
    return frozenset(
        int(d["index"]) for d in agent.devices if d.get("kind") == "gpu" and isinstance(d.get("index"), int)
    )


def sample_row(agent_id: str, sample: IncomingSample, at: datetime) -> dict[str, object]:
    """The device_samples row of an accepted sample."""
    return {
        "agent_id": agent_id,
        "device_index": sample.index,
        "at": at,
        "utilization_pct": sample.utilization_pct,
        "memory_used_mib": sample.memory_used_mib,
        "memory_total_mib": sample.memory_total_mib,
        "temperature_c": sample.temperature_c,
    }


def store_rows(session: Session, rows: list[dict[str, object]]) -> None:
    """Inserts sample rows in one executemany (the caller owns the transaction)."""
    if rows:
        session.execute(insert(DeviceSample), rows)


def retention_cutoff(
    retention_hours: float, telemetry_retention_days: float, now: datetime
) -> datetime | None:
    """Samples older than this are deleted: the shorter of the two windows that are on; None: keep all."""
    windows = [timedelta(hours=retention_hours)] if retention_hours > 0 else []
    if telemetry_retention_days > 0:
        windows.append(timedelta(days=telemetry_retention_days))
    return now - min(windows) if windows else None


def agents_after(session: Session, after: str, limit: int = PURGE_AGENTS) -> list[str]:
    """Agent ids after `after` in id order (the purge walks every agent, removed ones included)."""
    return list(session.scalars(select(Agent.id).where(Agent.id > after).order_by(Agent.id).limit(limit)))


def purge_before(
    session: Session, agent_ids: list[str], before: datetime, max_rows: int = PURGE_ROWS
) -> tuple[int, bool]:
    """Deletes up to `max_rows` samples older than `before` of each agent (a range of
    ix_device_samples_agent_at per agent); returns the rows deleted and whether some agent may have more."""
    deleted, more = 0, False
    for agent_id in agent_ids:
        doomed = (
            select(DeviceSample.id)
            .where(DeviceSample.agent_id == agent_id, DeviceSample.at < before)
            .limit(max_rows)
            .scalar_subquery()
        )
        result = session.execute(
            delete(DeviceSample)
            .where(DeviceSample.id.in_(doomed))
            .execution_options(synchronize_session=False)
        )
        count = int(result.rowcount or 0)  # type: ignore[attr-defined]
        deleted += count
        more = more or count >= max_rows
    return deleted, more
