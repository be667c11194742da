"""A stack dump holds 3 snapshots of every worker taken over about a second, on the shared real cluster
(tests/conftest.py `cluster`): the verdict rests on all of them, the API says how many snapshots said what,
and `mwms stacks` prints the same verdict."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import MWMS, wait_until

pytestmark = pytest.mark.e2e

SLEEPERS = (PROGRAMS / "sleepers" / "main.py").read_text()


def test_workers_outside_a_collective_in_every_snapshot_are_outside(cluster) -> None:
    job_id = cluster.submit({"main.py": SLEEPERS}, ["python", "main.py"], workers=2, name="snapshots")
    try:
        wait_until(
            lambda: all("WAITING" in cluster.logs_text(job_id, i) for i in (0, 1)),
            120,
            f"both workers of {job_id} WAITING",
        )
        started = time.monotonic()
        response = cluster.http.post(f"/api/v1/jobs/{job_id}/stacks")
        took = time.monotonic() - started
        assert response.status_code == 200, response.text
        assert 0.9 < took < 10, took  # 3 snapshots, 0.5 s apart
        dump = response.json()
        assert dump["complete"] and len(dump["tasks"]) == 2
        for task in dump["tasks"]:
            assert task["error"] == "", task["error"]
            assert (task["snapshots"], task["snapshots_in_collective"], task["in_collective"]) == (
                3,
                0,
                False,
            )
            markers = [line for line in task["text"].splitlines() if line.startswith("=== mwms snapshot ")]
            assert [m.split(" at ")[0] for m in markers] == [
                f"=== mwms snapshot {i} of 3" for i in (1, 2, 3)
            ], markers
            expected = "wait_before_first_allreduce" if task["task_index"] == 1 else "read_input_forever"
            assert expected in task["threads"][0]["frames"][0]  # one snapshot's threads, innermost first

        time.sleep(2.1)  # one dump per job every 2 s
        env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
        env.update(MWMS_API=cluster.api, MWMS_TOKEN=cluster.admin_token, COLUMNS="200")
        shown = subprocess.run([MWMS, "stacks", job_id], capture_output=True, text=True, env=env, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.count("in collective: NO (outside in 3 of 3 snapshots)") == 2, shown.stdout
    finally:
        cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
        cluster.wait_for(job_id, {"CANCELLED", "FAILED", "SUCCEEDED"})
