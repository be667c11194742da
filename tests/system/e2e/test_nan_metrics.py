"""A real 2-worker TensorFlow job whose loss goes NaN: the NaN reaches the API at its step, the agents stay
online, and with restart.fail_on_nan the job fails at once instead of training on."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.tf]

DIVERGING = """
import math, sys
import mwms_runtime

strategy = mwms_runtime.strategy()
values = {1: 1.0, 2: 0.5, 3: math.nan, 4: math.inf, 5: -math.inf, 6: 0.25}
for step, loss in values.items():
    mwms_runtime.report(step, {"loss": loss})
mwms_runtime.flush()
if "--keep-going" in sys.argv:
    import time
    time.sleep(120)
"""


def test_a_nan_loss_reaches_the_api_at_its_step_and_the_agents_stay_online(cluster):
    job_id = cluster.submit({"train.py": DIVERGING}, ["python", "train.py"], workers=2, name="nan-loss")
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"] + cluster.logs_text(job_id)
    points = cluster.metrics(job_id, name="loss")
    assert [(p["step"], p["value"]) for p in points] == [
        (1, 1.0),
        (2, 0.5),
        (3, "NaN"),
        (4, "Infinity"),
        (5, "-Infinity"),
        (6, 0.25),
    ]
    assert "refused" not in cluster.logs_text(job_id)
    agents = cluster.http.get("/api/v1/agents").json()
    assert agents and all(agent["online"] for agent in agents), agents


def test_fail_on_nan_fails_the_job_at_the_nan_step_without_a_restart(cluster):
    started = time.monotonic()
    job_id = cluster.submit(
        {"train.py": DIVERGING},
        ["python", "train.py", "--keep-going"],
        workers=2,
        name="fail-on-nan",
        restart={"max_restarts": 3, "fail_on_nan": ["loss"]},
    )
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=150)
    assert job["state"] == "FAILED", job["reason"]
    assert "'loss' was NaN at step 3" in job["reason"] and job["restarts"] == 0, job["reason"]
    assert time.monotonic() - started < 100  # the program would have slept 120 s more
    assert cluster.job(job_id)["loss"] in ("NaN", "Infinity", "-Infinity", 0.25)
