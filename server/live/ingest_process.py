"""The coordinator's side of its ingest process (server/ingest_worker.py): telemetry stored outside its interpreter.

Storing 100,000 log lines or metric points a second is pure Python and SQLite work that needs no event
loop; in the coordinator's process it held the interpreter that answers agents' heartbeats (p99 over
300 ms while 50 tasks streamed, bench/README.md). `IngestProcess` is the telemetry writer's store
(server/live/ingest.py): it hands each group of batches, as the bytes they came in, to the process over a
pipe (server/live/ingest_wire.py) and awaits its reply, while the process decodes, validates, stores and
commits. Up to `parallel` groups are in the pipe at once, so the process reads the next group as soon
as it has answered one.

The process is started on the first group, and again after it died (its stderr is the coordinator's log,
where it says why; one that dies before it is ready, a broken installation, is started again after a
growing delay). A group whose answer did not come is stored again by the next process: storing twice
inserts nothing twice (unique (task_id, seq)), so nothing acknowledged is lost or duplicated and no
stream has to end; meanwhile the streams wait, as for a slow database. Its outcome then says
`answer_lost`: the first process may have committed a change (a job failed on a NaN) whose answer is
gone, so the writer tells every connected agent and the scheduler to look.

A group the process was storing when it died (the first one waiting, once the process said it was
ready) is charged with that death; the groups behind it in the pipe are not, nor is any group when the
process dies while starting. A group charged TRIES times is stored one batch at a time, and a batch
charged TRIES times on its own is refused, with why (the agent drops it, as any refused batch): a batch
that kills the process cannot stall every agent's telemetry, and a process killed from outside (an
administrator, the OOM killer) costs no batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import deque
from typing import Any

from mwms.loop import Backoff
from mwms.server.live.ingest_store import RawBatch, StoredGroup
from mwms.server.live.ingest_wire import (
    LENGTH,
    READY,
    FrameError,
    IngestItemError,
    decode_reply,
    encode_request,
    frame_length,
)
from mwms.server.observability import metric_relay

log = logging.getLogger("mwms.server.ingest")
MODULE = "mwms.server.ingest_worker"
STOP_WAIT_S = 5.0
# Deaths of the process storing a group (or one batch) before it is split up (or refused).
TRIES = 2


class _Died(Exception):
    """The process ended (or broke the protocol) before it answered; `charged`: while storing this group."""

    def __init__(self, why: str, charged: bool) -> None:
        super().__init__(why)
        self.charged = charged


class IngestProcess:
    """One ingest process at a time, started when first needed; the telemetry writer's store."""

    parallel = 2

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config  # the worker's first line: url, log settings
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: deque[tuple[int, asyncio.Future[StoredGroup | Exception]]] = deque()
        self._starting = asyncio.Lock()
        self._ready = False  # the process now running said it is ready
        self._died_unready = False  # the last one died before it was ready: wait before the next
        self._backoff = Backoff(initial=0.2, maximum=5.0)
        self._numbers = 0
        self.starts = 0  # processes started (tests, logs)
        self.answered = 0  # groups answered, by every process (tests, logs)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def ready(self) -> bool:
        """The process now running has said it is ready."""
        return self._process is not None and self._ready

    @property
    def unanswered(self) -> int:
        """Groups handed to the process now running and not answered yet."""
        return len(self._waiting)

    async def store(self, batches: list[RawBatch]) -> StoredGroup:
        """Stores `batches` in one transaction in the ingest process (see the module's docstring)."""
        charged = deaths = 0
        while charged < TRIES:
            try:
                stored = await self._store_once(batches)
            except _Died as died:
                deaths += 1
                charged += died.charged
                if charged < TRIES:
                    log.warning("storing %d batch(es) again in a new ingest process", len(batches))
                continue
            stored.answer_lost = deaths > 0
            return stored
        if len(batches) > 1:
            log.error(
                "the ingest process died %d times storing %d batches; storing them one by one",
                TRIES,
                len(batches),
            )
            parts = [await self.store([batch]) for batch in batches]
            return StoredGroup(
                outcomes=[part.outcomes[0] for part in parts],
                targets=set().union(*(part.targets for part in parts)),
                held_s=max(part.held_s for part in parts),
                answer_lost=True,
            )
        (batch,) = batches
        log.error(
            "the ingest process died %d times storing a %s batch of task %s; refused",
            TRIES,
            batch.kind,
            batch.task_id,
        )
        refused = IngestItemError(f"the ingest process died {TRIES} times storing this batch")
        return StoredGroup(outcomes=[refused], answer_lost=True)

    async def _store_once(self, batches: list[RawBatch]) -> StoredGroup:
        process = await self._running()
        assert process.stdin is not None
        self._numbers += 1
        number = self._numbers
        answer: asyncio.Future[StoredGroup | Exception] = asyncio.get_running_loop().create_future()
        self._waiting.append((number, answer))  # replies come in the order requests were written
        try:
            process.stdin.write(encode_request(number, batches))
            await process.stdin.drain()
        except ConnectionError as error:
            self._ended(process, f"its pipe broke ({type(error).__name__})")
        outcome = await answer
        if isinstance(outcome, Exception):
            raise outcome  # the whole group failed (a transient error: the streams end and resend)
        return outcome

    async def _running(self) -> asyncio.subprocess.Process:
        async with self._starting:
            if self._process is not None and self._process.returncode is None:
                return self._process
            if self._died_unready:
                await asyncio.sleep(self._backoff.next_delay())
            try:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    MODULE,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=None,  # the coordinator's own log stream
                )
            except OSError as error:
                # As a process that died starting: the groups wait, and the next try comes after a delay.
                log.error("could not start the ingest process: %s", error)
                self._died_unready = True
                raise _Died(f"it could not be started ({error})", charged=False) from error
            assert process.stdin is not None
            process.stdin.write((json.dumps(self._config) + "\n").encode())
            self._process = process
            self._ready = False
            self._reader = asyncio.create_task(self._read_replies(process))
            self.starts += 1
            if self.starts > 1:
                log.warning("ingest process started again (pid %d)", process.pid)
            else:
                log.info("ingest process started (pid %d)", process.pid)
            return process

    async def _read_replies(self, process: asyncio.subprocess.Process) -> None:
        """Hands each reply to the group waiting for it, until the process ends."""
        assert process.stdout is not None
        why = "it exited"
        try:
            prefix = await process.stdout.readexactly(LENGTH.size)
            if await process.stdout.readexactly(frame_length(prefix)) != READY:
                raise FrameError("its first frame does not say it is ready")
            if self._process is process:
                self._ready = True
                self._died_unready = False
                self._backoff.reset()
            while True:
                body = await process.stdout.readexactly(
                    frame_length(await process.stdout.readexactly(LENGTH.size))
                )
                number, outcome, metrics = decode_reply(body)
                metric_relay.replay(metrics)
                if not self._waiting or self._waiting[0][0] != number:
                    raise FrameError(f"a reply for group {number}, which is not the next one waiting")
                _, answer = self._waiting.popleft()
                self.answered += 1
                if not answer.done():
                    answer.set_result(outcome)
        except asyncio.IncompleteReadError:
            pass
        except (FrameError, ConnectionError) as error:
            why = f"it broke the protocol ({error})"
        self._ended(process, why)

    def _ended(self, process: asyncio.subprocess.Process, why: str) -> None:
        """The process is gone or useless: it is killed, and every group waiting on it is tried again."""
        if self._process is not process:
            return
        self._process = None
        if process.returncode is None:
            process.kill()
        ready, self._died_unready = self._ready, not self._ready
        log.error(
            "the ingest process (pid %d) is gone%s: %s; %d group(s) unanswered",
            process.pid,
            "" if ready else " before it was ready",
            why,
            len(self._waiting),
        )
        waiting, self._waiting = self._waiting, deque()
        for position, (_, answer) in enumerate(waiting):
            if not answer.done():
                # Only the first group waiting was being stored when a ready process died.
                answer.set_exception(_Died(why, charged=ready and position == 0))

    async def stop(self) -> None:
        """Ends the process: its stdin closes, and it is killed if it has not exited within STOP_WAIT_S."""
        async with self._starting:
            process, self._process = self._process, None
        if process is not None and process.returncode is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), STOP_WAIT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        for _, answer in self._waiting:
            answer.cancel()
        self._waiting.clear()


def worker_config(settings: Any, url: str) -> dict[str, Any]:
    """The ingest process's first line."""
    return {"url": url, "log_format": settings.log_format, "log_level": settings.log_level}


def runs_apart(settings: Any, url: str) -> bool:
    """Whether telemetry is stored in an ingest process: when the settings say so and the database is one
    that another process can open (not an in-memory SQLite)."""
    if not getattr(settings, "ingest_process", True):
        return False
    in_memory = url.startswith("sqlite") and (url in ("sqlite://", "sqlite:///") or ":memory:" in url)
    return not in_memory
