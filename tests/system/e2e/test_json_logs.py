"""Logs for log shippers: a real coordinator and agents with `--log-format json` write nothing but JSON
lines, and those lines carry the events that matter (job and attempt states, a lost agent, a whole-gang
restart) with their ids as keys; no token appears in them.

Its own small cluster (short agent timeout), non-TensorFlow programs: well under a minute.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from typing import Any

import pytest

from mwms_testkit.cluster import Cluster, Process, processes_of_job, wait_until

pytestmark = pytest.mark.e2e
AGENT_TIMEOUT_S = 4
PROGRAMS = {
    "ok.py": "print('all good', flush=True)\n",
    "fail.py": "import sys\nprint('bad hyperparameter', flush=True)\nsys.exit(3)\n",
    "sleep.py": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n",
}


class JsonLogCluster(Cluster):
    """Every `mwms server` and `mwms agent` of this cluster runs with --log-format json."""

    def server_args(self) -> list[str]:
        return ["--log-format", "json", "--log-level", "info"]

    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Process:
        if args[0] == "agent":
            args = [*args, "--log-format", "json"]
        return super()._spawn(name, args, extra_env)


@pytest.fixture(scope="module")
def json_cluster(tmp_path_factory):
    cluster = JsonLogCluster(
        root=tmp_path_factory.mktemp("json-logs"),
        server_env={
            "MWMS_AGENT_TIMEOUT_S": str(AGENT_TIMEOUT_S),
            "MWMS_HEARTBEAT_INTERVAL_S": "1",
            "MWMS_STOP_GRACE_S": "2",
        },
    )
    try:
        cluster.start_server()
        cluster.start_agent("json-1", 24000)
        cluster.start_agent("json-2", 24100)
        yield cluster
    finally:
        cluster.stop()


def records(process: Process) -> list[dict[str, Any]]:
    """Every line the process wrote to stdout and stderr, each parsed as one JSON object."""
    parsed = []
    for number, line in enumerate(process.log_path.read_text().split("\n"), start=1):
        if not line:
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"{process.log_path} line {number} is not JSON: {line!r}") from None
        assert isinstance(entry, dict) and {"time", "level", "logger", "message"} <= entry.keys(), line
        parsed.append(entry)
    return parsed


def events(process: Process, event: str, **fields: Any) -> list[dict[str, Any]]:
    """The process's `event` records whose fields hold `fields`."""
    return [
        r
        for r in records(process)
        if r.get("event") == event and all(r.get(k) == v for k, v in fields.items())
    ]


def test_every_line_is_json_and_the_events_carry_their_ids(json_cluster: JsonLogCluster) -> None:
    cluster = json_cluster
    server = cluster.server
    assert server is not None
    ok = cluster.submit(PROGRAMS, ["python", "ok.py"], workers=1, name="json-ok")
    failing = cluster.submit(PROGRAMS, ["python", "fail.py"], workers=1, name="json-fail")
    assert cluster.wait_for(ok, {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "SUCCEEDED"
    assert cluster.wait_for(failing, {"SUCCEEDED", "FAILED"}, timeout=60)["state"] == "FAILED"

    # A job on json-2, whose agent then dies without a word: lost, and the job restarts its gang.
    sleeper = cluster.submit(
        PROGRAMS, ["python", "sleep.py"], workers=1, agents=["json-2"], restart={"max_restarts": 2}
    )
    cluster.wait_for(sleeper, {"RUNNING"}, timeout=60)
    doomed = cluster.agents["json-2"]
    os.killpg(doomed.popen.pid, signal.SIGKILL)
    doomed.popen.wait()
    wait_until(
        lambda: events(server, "agent_lost", agent="json-2"),
        AGENT_TIMEOUT_S + 20,
        "the coordinator's agent_lost line",
        observed=server.log_tail,
    )
    wait_until(lambda: events(server, "job_restart", job_id=sleeper), 20, "the restart line")
    for pid in processes_of_job(sleeper):  # the killed agent's task, if it outlived its agent
        os.kill(pid, signal.SIGKILL)
    assert cluster.http.post(f"/api/v1/jobs/{sleeper}/cancel").status_code == 200

    # A token in a query string must not reach the log either (there is no access log to print it).
    query_secret = secrets.token_urlsafe(24)
    cluster.http.get("/api/v1/agents", params={"access_token": query_secret})
    cluster.stop()  # flushes and closes every log

    for job_id, final in ((ok, "SUCCEEDED"), (failing, "FAILED")):
        states = [r["state"] for r in events(server, "job_state", job_id=job_id)]
        assert states == ["PENDING", "SCHEDULED", "RUNNING", final], states
        attempts = [(r["attempt"], r["state"]) for r in events(server, "attempt_state", job_id=job_id)]
        assert attempts == [(1, "ACTIVE"), (1, final)], attempts
    (failed,) = events(server, "job_state", job_id=failing, state="FAILED")
    assert "exited with code 3" in failed["reason"] and failed["level"] == "INFO"
    assert failed["message"].startswith(f"job {failing}: RUNNING -> FAILED: ")
    (lost,) = events(server, "agent_lost", agent="json-2")
    assert lost["tasks_lost"] == 1 and lost["agent_id"]
    (restart,) = events(server, "job_restart", job_id=sleeper)
    assert (restart["cause"], restart["attempt"], restart["restart"]) == ("agent_lost", 1, 1)

    loggers = {r["logger"] for r in records(server)}
    assert {"uvicorn.error", "mwms.server", "mwms.server.events"} <= loggers, loggers
    survivor = cluster.agents["json-1"]
    assert any(r["logger"].startswith("mwms.agent") for r in records(survivor))
    assert records(doomed), "the killed agent wrote no JSON line before it died"

    credential = (cluster.root / "json-1" / "agent-credential").read_text().strip()
    for process in (server, survivor, doomed):
        text = process.log_path.read_text()
        for secret in (cluster.admin_token, cluster.join_token, credential, query_secret):
            assert secret not in text, f"a secret is in {process.log_path}"
