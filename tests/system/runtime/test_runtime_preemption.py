"""Preemption as the agent does it, on real TensorFlow workers: SIGTERM to the gang, exit 42, resume.

Each test runs a job, sends SIGTERM to every task once training is under way, expects every task to
exit with PREEMPTED_AND_SAVED_EXIT_CODE, then relaunches the job as the next attempt with the same
checkpoint directory and checks it resumed where the checkpoint was saved and that the metrics of both
attempts hold every step exactly once.
"""

from __future__ import annotations

import http.server
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_runtime_workers import _by_name

from mwms.task_environment import PREEMPTED_AND_SAVED_EXIT_CODE
from mwms_testkit import PROGRAMS
from mwms_testkit.runtime_cluster import Gang, read_metrics, run_tasks, start_tasks

pytestmark = pytest.mark.tf


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, list[str]]]:
    """A stand-in GCE metadata server on loopback (GCE_METADATA_IP) that records every request it gets."""
    requests: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


def _wait_for_output(gang: Gang, pattern: str, count: int, timeout: float = 60.0) -> None:
    """Poll every task's stdout until each shows ``count`` lines matching ``pattern``."""
    deadline = time.monotonic() + timeout
    seen: list[int] = []
    while time.monotonic() < deadline:
        seen = [len(re.findall(pattern, gang.stdout(i), re.MULTILINE)) for i in range(len(gang.procs))]
        if min(seen) >= count:
            return
        if any(proc.poll() is not None for proc, _, _ in gang.procs):
            break
        time.sleep(0.05)
    results = gang.wait(timeout=5)
    raise AssertionError(
        f"saw {seen} lines matching {pattern!r}\n" + "\n".join(r.describe() for r in results)
    )


def _preempt(gang: Gang, pattern: str, count: int) -> list:
    _wait_for_output(gang, pattern, count)
    gang.send_signal(signal.SIGTERM)
    results = gang.wait(timeout=45)
    for result in results:
        assert result.returncode == PREEMPTED_AND_SAVED_EXIT_CODE, result.describe()
        assert "exiting with code 42" in result.stderr, result.describe()
    return results


@pytest.mark.parametrize(
    ("num_workers", "manager"),
    [(2, False), (1, False), (2, True)],
    ids=["2-workers", "1-worker", "2-manager"],
)
def test_custom_loop_preempted_saves_exits_42_and_resumes_without_losing_a_step(
    tmp_path: Path, num_workers, manager, metadata_server
):
    # With manager: the handler saves through the program's CheckpointManager (periodic saves every 10
    # steps into the same series); preempted after step 12 or later, it must resume after its own save.
    program = [str(PROGRAMS / "preempt_custom_loop.py"), "--steps", "40", *(["--manager"] if manager else [])]
    address, requests = metadata_server
    gang = start_tasks([*program, "--delay", "0.1"], tmp_path, tmp_path, num_workers, GCE_METADATA_IP=address)
    first = _preempt(gang, r"^STEP \d+$", 12 if manager else 5)
    assert "RESUMED 0 " in first[0].stdout
    assert requests == []  # TensorFlow's handler did not ask whether it runs on Google Cloud
    saved = [line["step"] for line in read_metrics(tmp_path / "metrics-0.jsonl")]
    assert saved == list(range(1, len(saved) + 1)) and len(saved) >= 5, saved
    # Every worker stopped after the same step: the one the checkpoint holds.
    for result in first:
        assert re.findall(r"^STEP (\d+)$", result.stdout, re.MULTILINE)[-1] == str(saved[-1])
        assert "DONE" not in result.stdout

    second = run_tasks(program, tmp_path, tmp_path, num_workers, timeout=60, MWMS_ATTEMPT="2")
    for result in second:
        assert result.returncode == 0, result.describe()
        assert f"RESUMED {saved[-1]} " in result.stdout, result.describe()
        assert re.findall(r"^STEP (\d+)$", result.stdout, re.MULTILINE)[0] == str(saved[-1] + 1)
    lines = read_metrics(tmp_path / "metrics-0.jsonl")
    assert [line["step"] for line in _by_name(lines)["loss"]] == list(range(1, 41))
    assert read_metrics(tmp_path / "metrics-1.jsonl") == []


def test_fit_with_backup_and_restore_preempted_exits_42_and_resumes_at_the_next_batch(
    tmp_path: Path, metadata_server
):
    program = [str(PROGRAMS / "preempt_fit.py"), "--epochs", "3", "--steps", "8"]
    address, requests = metadata_server
    gang = start_tasks([*program, "--delay", "0.1"], tmp_path, tmp_path, 2, GCE_METADATA_IP=address)
    first = _preempt(gang, r"^BATCH epoch=\d+ batch=\d+$", 10)
    assert requests == []  # neither tf-keras nor TensorFlow asked whether they run on Google Cloud
    ends = [re.findall(r"^BATCH epoch=(\d+) batch=(\d+)$", r.stdout, re.MULTILINE)[-1] for r in first]
    assert ends[0] == ends[1], ends  # both workers saved at the same batch
    epoch, batch = (int(part) for part in ends[0])
    assert (epoch, batch) != (2, 7), "the job finished before the preemption"
    resume_at = (epoch + 1, 0) if batch == 7 else (epoch, batch + 1)

    second = run_tasks(program, tmp_path, tmp_path, 2, timeout=60, MWMS_ATTEMPT="2")
    for result in second:
        assert result.returncode == 0, result.describe()
        assert "DONE" in result.stdout
        assert f"FIRST epoch={resume_at[0]} batch={resume_at[1]}" in result.stdout, result.describe()
    # MetricsCallback's global batch steps: every one of the 24 exactly once across both attempts.
    steps = [line["step"] for line in _by_name(read_metrics(tmp_path / "metrics-0.jsonl"))["loss"]]
    assert steps == list(range(1, 25)), steps
