"""The agent's side of the preflight check: the real check process, run for a real TaskRecord.

A gang whose peer never comes fails with the check's message; a check past its time limit is killed; a
StopTask during the check ends it without a result. (A passing check is covered by tests/system/e2e/test_preflight.py.)
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent import preflight
from mwms.worker_agent.task_env import TaskPaths, child_environment
from mwms.worker_agent.task_record import TaskRecord
from mwms_testkit.cluster import free_port


def unconfined(command: list[str]) -> tuple[dict[str, object], list[str]]:
    """The check as a plain child of this process (the sandbox has its own tests)."""
    return {}, command


def record_for(
    tmp_path: Path, timeout_s: int, connect_timeout_s: str
) -> tuple[TaskRecord, dict[str, str], str]:
    me, peer = free_port(), free_port()  # nothing listens on the peer's port
    start = agent_pb2.StartTask(
        task_id="t0",
        job_id="j",
        attempt=1,
        task_index=0,
        num_workers=2,
        tf_config=json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{me}", f"127.0.0.1:{peer}"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
        port=me,
        env={"MWMS_PREFLIGHT_CONNECT_TIMEOUT_S": connect_timeout_s},
        preflight=True,
        preflight_timeout_seconds=timeout_s,
    )
    paths = TaskPaths.for_task(tmp_path, start)
    paths.create_fresh()
    record = TaskRecord(start, paths, tmp_path / "outbox" / "t0")
    return record, child_environment(start, paths, os.environ), f"127.0.0.1:{peer}"


def test_an_unreachable_peer_fails_the_check_with_its_message(tmp_path: Path) -> None:
    record, env, peer = record_for(tmp_path, timeout_s=60, connect_timeout_s="1")
    started = time.monotonic()
    outcome = preflight.run_check(record, env, unconfined)
    assert not outcome.ok and not outcome.stopped
    assert outcome.exit_code == 3, outcome
    assert f"worker 0 (host 127.0.0.1) cannot reach worker 1 at {peer}" in outcome.message
    assert json.loads(outcome.report_json)["phase"] == "reachability"
    assert preflight.failure_message(outcome).startswith("preflight check failed: worker 0")
    assert time.monotonic() - started < 30
    result = outcome.result("t0")
    assert result.task_id == "t0" and not result.ok and peer in result.message
    assert record.process is None and record.pid  # the check's pid stays recorded
    lines = [line.text for line in record.logs.unacked(limit=1000)]
    assert any("mwms preflight: FAILED" in line for line in lines), lines


def test_a_check_past_its_time_limit_is_killed(tmp_path: Path) -> None:
    record, env, _ = record_for(tmp_path, timeout_s=1, connect_timeout_s="60")
    started = time.monotonic()
    outcome = preflight.run_check(record, env, unconfined)
    assert not outcome.ok and outcome.exit_code == preflight.TIMEOUT_EXIT_CODE
    assert "did not finish within 1 s" in outcome.message
    assert time.monotonic() - started < 20


def test_a_stop_during_the_check_ends_it_without_a_result(tmp_path: Path) -> None:
    record, env, _ = record_for(tmp_path, timeout_s=60, connect_timeout_s="60")
    found: list[preflight.CheckOutcome] = []
    runner = threading.Thread(target=lambda: found.append(preflight.run_check(record, env, unconfined)))
    runner.start()
    deadline = time.monotonic() + 30
    while record.process is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with record.lock:  # what TaskManager.stop does
        record.stop_reason = "stopped by the coordinator"
        process = record.process
    assert process is not None
    process.terminate(5)
    runner.join(30)
    assert found and found[0].stopped and not found[0].ok


def test_a_task_stopped_before_the_check_never_starts_it(tmp_path: Path) -> None:
    record, env, _ = record_for(tmp_path, timeout_s=60, connect_timeout_s="60")
    record.stop_reason = "stopped"
    outcome = preflight.run_check(record, env, unconfined)
    assert outcome.stopped and record.pid == 0
