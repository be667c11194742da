"""The preflight check of a task's gang, run by the agent before the task's program (StartTask.preflight).

The check is ``python -m mwms_runtime.preflight`` with the task's own environment (TF_CONFIG, port,
devices) and the agent's interpreter, in the task's bundle dir; its output joins the task's logs. While it
runs it is the task's process, so a StopTask ends it like the program. The agent waits at most
StartTask.preflight_timeout_seconds, then kills it.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mwms.preflight_contract import REPORT_ENV, parse_report
from mwms.v1 import agent_pb2
from mwms.worker_agent import agent_state
from mwms.worker_agent.runner import TaskProcess
from mwms.worker_agent.task_files import read_beneath
from mwms.worker_agent.task_record import TaskRecord

log = logging.getLogger("mwms.agent.preflight")

DEFAULT_TIMEOUT_S = 120.0
# Exit code reported when the check ran out of time (as timeout(1) reports it).
TIMEOUT_EXIT_CODE = 124
KILL_GRACE_S = 5.0
MAX_REPORT_BYTES = 64 * 1024


@dataclass(frozen=True)
class CheckOutcome:
    """How the check ended: `stopped` when a StopTask ended it (no result to send)."""

    ok: bool
    exit_code: int
    message: str
    report_json: str
    stopped: bool = False

    def result(self, task_id: str) -> agent_pb2.PreflightResult:
        return agent_pb2.PreflightResult(
            task_id=task_id, ok=self.ok, message=self.message, report_json=self.report_json
        )


def run_check(
    record: TaskRecord,
    env: dict[str, str],
    launch: Callable[[list[str]], tuple[dict[str, Any], list[str]]],
) -> CheckOutcome:
    """Runs the check for `record` and waits for it; the record's process is the check meanwhile.

    `launch(command)` confines the check like the task's program (TaskManager.launch_for).
    """
    timeout_s = float(record.start.preflight_timeout_seconds) or DEFAULT_TIMEOUT_S
    report_path = record.paths.task_dir / "preflight.json"
    report_path.unlink(missing_ok=True)
    exited = threading.Event()
    switch, argv = launch([sys.executable, "-m", "mwms_runtime.preflight"])
    process = TaskProcess(
        argv,
        {**env, REPORT_ENV: str(report_path)},
        record.paths.bundle_dir,
        record.add_log,
        lambda _code: exited.set(),
        **switch,
    )
    with record.lock:
        if record.ended or record.stop_reason is not None:
            return CheckOutcome(False, 0, "", "", stopped=True)
        record.process = process
        record.pid = process.start()
        record.start_ticks = agent_state.process_start_ticks(record.pid)
    log.info("task %s: preflight check running as pid %d", record.task_id, record.pid)
    timed_out = not exited.wait(timeout_s)
    if timed_out:
        process.terminate(KILL_GRACE_S)
        exited.wait(KILL_GRACE_S + 10.0)
    with record.lock:
        # From here a StopTask finds no process and ends the task itself; one that came earlier is seen.
        record.process = None
        if record.stop_reason is not None:
            return CheckOutcome(False, process.exit_code or 0, "", "", stopped=True)
    try:  # written by the task's user: read without following a link it may have put there
        raw = read_beneath(record.paths.task_dir, report_path, MAX_REPORT_BYTES)
        text = raw.decode("utf-8", errors="replace")
    except OSError:
        text = ""
    report = parse_report(text)
    if timed_out:
        return CheckOutcome(
            False,
            TIMEOUT_EXIT_CODE,
            f"the preflight check did not finish within {timeout_s:g} s (a peer that never joined the "
            "all-reduce, or a very slow link); see the task's log",
            text,
        )
    exit_code = process.exit_code if process.exit_code is not None else -1
    if exit_code == 0 and report.get("ok") is True:
        return CheckOutcome(True, 0, "", text)
    message = str(report.get("message") or f"the preflight check exited with code {exit_code}; see the log")
    return CheckOutcome(False, exit_code or 1, message, text)


def failure_message(outcome: CheckOutcome) -> str:
    """The task's FAILED message for a failed check (the coordinator puts it in the attempt's reason)."""
    return f"preflight check failed: {outcome.message}"
