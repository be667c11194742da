"""The coordinator's side of its scheduler process (server/live/scheduler_worker.py).

`SchedulerProcess.run_pass(held)` asks the process for one pass and awaits its answer without holding
the event loop or the interpreter: the coordinator's process only writes a line and reads one. The
process is started with the coordinator (standing by on a replica that does not lead the scheduler) and
again after it died (its stderr is the coordinator's log, where it says why); a pass it could not answer
raises SchedulerProcessError, which the scheduler loop logs and retries after its backoff. Only the replica
that leads the scheduler asks for passes (server/live/pass_locks.py), so on replicas only the leader's
process plans.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from mwms.server.observability import metric_relay

log = logging.getLogger("mwms.server.scheduling")
MODULE = "mwms.server.live.scheduler_worker"
# A reply line holds the touched agents' ids and the pass's metric records: bounded by the cluster's size.
REPLY_LIMIT = 64 * 1024 * 1024
STOP_WAIT_S = 5.0


class SchedulerProcessError(RuntimeError):
    """The scheduler process could not answer a pass (it failed, died or could not start)."""


@dataclass
class PassResult:
    touched: list[str]
    seconds: float  # the pass's own time, in the scheduler process
    metrics: int = 0  # metric records replayed here
    phases: dict[str, float] = field(default_factory=dict)  # seconds per part (scheduling.schedule_pass)


class SchedulerProcess:
    """One scheduler process at a time, started by `prepare` or when first needed."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config  # the worker's first line: url, policy, replica_id, log settings
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.starts = 0  # processes started (tests, logs)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def prepare(self) -> None:
        """Starts the process ahead of the first pass. A replica that takes over the scheduler when its
        leader dies then plans at its next tick, instead of first starting an interpreter that imports the
        scheduler (seconds on a loaded machine). Failing here is only logged: the first pass tries again."""
        async with self._lock:
            if self._process is not None:
                return
            try:
                await self._running()
            except SchedulerProcessError as error:
                log.warning("%s; the first pass tries again", error)

    async def run_pass(self, held: frozenset[str]) -> PassResult:
        """One pass in the scheduler process; `held`: agents whose streams this coordinator holds."""
        async with self._lock:
            process = await self._running()
            assert process.stdin is not None and process.stdout is not None
            request = json.dumps({"held": sorted(held)}) + "\n"
            try:
                process.stdin.write(request.encode())
                await process.stdin.drain()
                line = await process.stdout.readline()
            except (ConnectionError, asyncio.LimitOverrunError, ValueError) as error:
                await self._discard(f"its pipe broke ({type(error).__name__})")
                raise SchedulerProcessError(f"the scheduler process could not answer: {error}") from error
            if not line:
                code = await self._discard("it exited")
                raise SchedulerProcessError(
                    f"the scheduler process exited (status {code}); starting it again"
                )
            reply = json.loads(line)
        replayed = metric_relay.replay(reply.get("metrics") or [])
        if reply.get("error"):
            raise SchedulerProcessError(f"scheduler pass failed in the scheduler process: {reply['error']}")
        return PassResult(
            touched=[str(a) for a in reply.get("touched") or []],
            seconds=float(reply.get("seconds") or 0.0),
            metrics=replayed,
            phases={str(k): float(v) for k, v in (reply.get("phases") or {}).items()},
        )

    async def _running(self) -> asyncio.subprocess.Process:
        if self._process is not None:
            if self._process.returncode is None:
                return self._process
            log.error(
                "the scheduler process (pid %d) exited between passes, status %s",
                self._process.pid,
                self._process.returncode,
            )
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                MODULE,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,  # the coordinator's own log stream
                limit=REPLY_LIMIT,
            )
        except OSError as error:
            raise SchedulerProcessError(f"could not start the scheduler process: {error}") from error
        assert process.stdin is not None
        process.stdin.write((json.dumps(self._config) + "\n").encode())
        self._process = process
        self.starts += 1
        if self.starts > 1:
            log.warning("scheduler process started again (pid %d)", process.pid)
        else:
            log.info("scheduler process started (pid %d)", process.pid)
        return process

    async def _discard(self, why: str) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.returncode is None:
            process.kill()
        code = await process.wait()
        log.error("the scheduler process (pid %d) is gone: %s, status %s", process.pid, why, code)
        return code

    async def stop(self) -> None:
        """Ends the process: its stdin closes, and it is killed if it has not exited within STOP_WAIT_S."""
        async with self._lock:
            process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_WAIT_S)
        except TimeoutError:
            process.kill()
            await process.wait()


def worker_config(settings: Any, url: str, policy: Any, replica_id: str) -> dict[str, Any]:
    """The scheduler process's first line."""
    return {
        "url": url,
        "policy": {
            "grace_s": policy.grace_s,
            "min_runtime_s": policy.min_runtime_s,
            "max_preemptions_per_hour": policy.max_preemptions_per_hour,
        },
        "replica_id": replica_id,
        "log_format": settings.log_format,
        "log_level": settings.log_level,
    }


def runs_apart(settings: Any, url: str) -> bool:
    """Whether passes run in a scheduler process: when the settings say so and the database is one that
    another process can open (not an in-memory SQLite)."""
    if not getattr(settings, "scheduler_process", True):
        return False
    in_memory = url.startswith("sqlite") and (url in ("sqlite://", "sqlite:///") or ":memory:" in url)
    return not in_memory
