"""The scheduler process stands by from the coordinator's start (server/live/scheduler_process.py): a replica
that takes over the scheduler when its leader dies plans at its next tick, instead of first starting an
interpreter that imports the scheduler (bench/replicas.py, scheduler_failover: 5.95-7.16 s from the kill to
the job's first StartTask before, 1.82-2.21 s after, paired); and it ends quietly with its coordinator."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.live.scheduler_process import MODULE, SchedulerProcess, worker_config
from mwms.server.services.scheduler.scheduling import SharingPolicy
from mwms.server.settings import Settings


def test_the_scheduler_process_stands_by_before_the_first_pass_and_serves_it(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    settings.data_dir.mkdir(exist_ok=True)
    db = Database(settings.database_url)
    upgrade_to_head(db.engine)

    async def scenario() -> None:
        process = SchedulerProcess(worker_config(settings, db.url, SharingPolicy.of(settings), "standby"))
        try:
            await process.prepare()
            pid = process.pid
            assert pid is not None and Path(f"/proc/{pid}").exists()
            await process.prepare()  # standing by already: no second process
            result = await process.run_pass(frozenset())
            assert result.touched == []
            assert process.pid == pid and process.starts == 1
        finally:
            await process.stop()

    asyncio.run(scenario())
    db.dispose()


def test_a_scheduler_process_whose_coordinator_died_stops_quietly(tmp_path: Path) -> None:
    """A coordinator killed while its scheduler process answers: the reply meets a closed pipe. The process
    stops with status 0 and one line saying why, not a traceback logged as CRITICAL."""
    settings = Settings(data_dir=tmp_path)
    settings.data_dir.mkdir(exist_ok=True)
    db = Database(settings.database_url)
    upgrade_to_head(db.engine)
    config = worker_config(settings, db.url, SharingPolicy.of(settings), "gone")
    worker = subprocess.Popen(
        [sys.executable, "-m", MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdout.close()  # the coordinator's end of the replies, gone
    worker.stdin.write(json.dumps(config).encode() + b"\n" + json.dumps({"held": []}).encode() + b"\n")
    worker.stdin.flush()
    _, stderr = worker.communicate(timeout=60)
    db.dispose()
    assert worker.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr and b"CRITICAL" not in stderr, stderr.decode()
    assert b"stopped reading the scheduler process's replies" in stderr
