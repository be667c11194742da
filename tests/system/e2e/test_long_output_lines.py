"""A program whose output is long lines, 24 MB of them at once, on the shared cluster's real agent and
coordinator: the agent sends them in batches the coordinator takes (at most BATCH_MAX_BYTES each), so every
line is stored once and the task's final report follows them; a log page holds the newest that fit its budget.

Before, up to 500 lines went in one message whatever their size; past the coordinator's 16 MiB the message
ended the agent's whole stream (RESOURCE_EXHAUSTED), the agent sent it again on every reconnect, and neither
those lines nor any later report of that agent's tasks got through: the job stayed RUNNING for ever."""

from __future__ import annotations

import sqlite3

import pytest

from mwms.server.services.observing.telemetry_reads import MAX_LOG_PAGE_CHARS
from mwms.worker_agent.connection import BATCH_MAX_BYTES
from mwms.worker_agent.output_lines import MAX_LINE_BYTES

pytestmark = pytest.mark.e2e

LINES = 400
WIDTH = 60_000  # under MAX_LINE_BYTES: each is one line, not pieces
LONG_LINES = f"""
import sys
for i in range({LINES}):
    sys.stdout.write(f"{{i:05d}}" + "x" * ({WIDTH} - 5) + "\\n")
sys.stdout.flush()
print("all written", flush=True)
"""


def test_24_mb_of_long_lines_reach_the_coordinator_and_the_job_ends(cluster) -> None:
    # More than one message may hold (16 MiB), in lines each far under a batch's bytes.
    assert WIDTH < MAX_LINE_BYTES and LINES * WIDTH > 16 * 1024 * 1024 and WIDTH < BATCH_MAX_BYTES // 8
    job_id = cluster.submit({"long.py": LONG_LINES}, ["python", "long.py"], workers=1)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"]
    # The page holds the newest lines within MAX_LOG_PAGE_CHARS (8 MiB), not all 24 MB of them.
    texts = [line["text"] for line in cluster.logs(job_id)]
    assert texts[-1] == "all written"
    shown = [int(text[:5]) for text in texts[:-1]]
    assert shown == list(range(LINES - len(shown), LINES))
    assert len(shown) == MAX_LOG_PAGE_CHARS // WIDTH
    # Every line stored once (read in the coordinator's database: no page holds them all).
    with sqlite3.connect(f"file:{cluster.root / 'data' / 'mwms.db'}?mode=ro", uri=True) as database:
        stored = database.execute(
            "SELECT count(*), count(DISTINCT seq), min(substr(text, 1, 5)), max(substr(text, 1, 5)) "
            "FROM log_lines WHERE job_id = ? AND length(text) = ?",
            (job_id, WIDTH),
        ).fetchone()
    assert stored == (LINES, LINES, "00000", f"{LINES - 1:05d}")
