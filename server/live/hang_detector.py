"""Hang detection: a periodic check for RUNNING attempts none of whose tasks made progress (a log line
or metric point) for the job's hang timeout; such an attempt's stacks are dumped (cause "hang") and it
ends by the job's restart policy (server/services/job_life/hangs.py).

A task's clock starts when it starts RUNNING, or when this coordinator started, whichever is later;
progress is what this replica stored (in memory: server/live/task_progress.py) or any replica flushed
to the database. The check runs on one replica at a time (server/live/pass_locks.py). Each attempt is
flagged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from datetime import datetime

from prometheus_client import Counter

from mwms.loop import run_every_async
from mwms.server.db.engine import Database
from mwms.server.db.models import utcnow
from mwms.server.errors import DomainError
from mwms.server.live.pass_locks import PassLocks
from mwms.server.live.stack_collector import StackCollector
from mwms.server.live.task_progress import TaskProgress
from mwms.server.services.fleet.command_targets import track_command_targets
from mwms.server.services.job_life import hangs
from mwms.server.settings import Settings

log = logging.getLogger("mwms.server.hangs")
CHECK_INTERVAL_S = 1.0
# How long a hang's stack dump waits for the agents' answers before the attempt is ended.
DUMP_WAIT_S = 5.0

HANG_DETECTIONS = Counter(
    "mwms_hang_detections_total",
    "RUNNING attempts ended as hung: no log line or metric point from any task for the job's hang timeout",
)


class HangDetector:
    """Runs the check every CHECK_INTERVAL_S seconds once started."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        stacks: StackCollector,
        progress: TaskProgress,
        wake_agents: Callable[[Iterable[str]], None],
        poke_scheduler: Callable[[], None],
        clock: Callable[[], datetime] = utcnow,
        passes: PassLocks | None = None,
    ) -> None:
        self._passes = passes or PassLocks(db)
        self._db = db
        self._settings = settings
        self._stacks = stacks
        self._progress = progress
        self._wake_agents = wake_agents
        self._poke = poke_scheduler
        self._clock = clock
        self._started_at = clock()
        self._flagged: set[str] = set()  # attempt ids already handled
        self._runner: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._runner = asyncio.create_task(run_every_async(CHECK_INTERVAL_S, self._check_once, logger=log))

    async def _check_once(self) -> None:
        await self._passes.run("hang-detection", self.check)

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)

    async def check(self) -> None:
        """One pass: finds hung attempts and handles them, all at once."""
        default_s = self._settings.hang_timeout_s

        def read() -> list[hangs.WatchedAttempt]:
            with self._db.read() as session:
                return hangs.running_attempts(session, default_s)

        watched = await asyncio.to_thread(read)
        self._progress.retain(t.task_id for w in watched for t in w.tasks)
        self._flagged &= {w.attempt_id for w in watched}
        now = self._clock()
        hung = []
        for attempt in watched:
            if attempt.timeout_s is None or attempt.attempt_id in self._flagged:
                continue
            moments = [self._started_at]
            for task in attempt.tasks:
                local = self._progress.last(task.task_id)
                moments += [m for m in (task.started_at, task.progress_at, local) if m is not None]
            if (now - max(moments)).total_seconds() >= attempt.timeout_s:
                self._flagged.add(attempt.attempt_id)
                hung.append(attempt)
        outcomes = await asyncio.gather(*(self._handle(attempt) for attempt in hung), return_exceptions=True)
        for attempt, outcome in zip(hung, outcomes, strict=True):
            if isinstance(outcome, Exception):
                # Not handled (the database was busy, say): the next pass tries this attempt again.
                self._flagged.discard(attempt.attempt_id)
                log.error("handling the hang of job %s failed: %r", attempt.job_id, outcome)

    async def _handle(self, attempt: hangs.WatchedAttempt) -> None:
        assert attempt.timeout_s is not None
        log.warning(
            "job %s attempt %d: no progress for %g s; dumping its stacks",
            attempt.job_id,
            attempt.attempt,
            attempt.timeout_s,
        )
        request_id: str | None = None
        try:
            opened = await self._stacks.collect(attempt.job_id, "hang", "hang detection", DUMP_WAIT_S)
            request_id = opened.request_id
        except DomainError as error:  # the job left RUNNING meanwhile
            log.info("job %s: no stacks for its hang: %s", attempt.job_id, error)

        def act() -> tuple[str | None, set[str]]:
            with self._db.write() as session:
                targets = track_command_targets(session)
                reason = hangs.act_on_hang(
                    session,
                    attempt.job_id,
                    attempt.attempt_id,
                    attempt.timeout_s or 0.0,
                    request_id,
                    backoff_base_s=self._settings.restart_backoff_s,
                )
            return reason, targets

        reason, targets = await asyncio.to_thread(act)
        if reason is None:
            return
        HANG_DETECTIONS.inc()
        log.warning("job %s attempt %d is hung: %s", attempt.job_id, attempt.attempt, reason)
        if targets:
            self._wake_agents(targets)
        self._poke()
