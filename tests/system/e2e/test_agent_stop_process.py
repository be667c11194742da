"""A cleanly stopped agent is not lost, on a real cluster: `mwms agent` SIGTERMed (what `systemctl stop`
sends) stops its task, reports it and says goodbye, and past the agent timeout it reads as stopped in
GET /api/v1/agents with no `mwms_agent_lost` series; a SIGKILLed one is still lost.

Its own small cluster (short agent timeout), a non-TensorFlow program: well under a minute.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mwms_testkit.cluster import MWMS, Cluster, processes_of_job, wait_until

pytestmark = pytest.mark.e2e
AGENT_TIMEOUT_S = 3
SLEEP = {"sleep.py": "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n"}


@pytest.fixture(scope="module")
def goodbye_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cluster = Cluster(
        root=tmp_path_factory.mktemp("goodbye"),
        server_env={
            "MWMS_AGENT_TIMEOUT_S": str(AGENT_TIMEOUT_S),
            "MWMS_HEARTBEAT_INTERVAL_S": "1",
            "MWMS_STOP_GRACE_S": "2",
        },
    )
    try:
        cluster.start_server()
        cluster.start_agent("bye-1", 25000)
        cluster.start_agent("bye-2", 25100)
        yield cluster
    finally:
        cluster.stop()


def agent(cluster: Cluster, name: str) -> dict[str, Any]:
    return next(a for a in cluster.http.get("/api/v1/agents").json() if a["name"] == name)


def lost_series(cluster: Cluster) -> set[str]:
    """The agents named by mwms_agent_lost on /metrics."""
    text = cluster.http.get("/metrics").text
    return {
        sample.labels["agent"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mwms_agent_lost"
    }


def cli_status(cluster: Cluster, name: str) -> str:
    """The STATUS cell of `mwms agents` (the operator's tool) for agent `name`."""
    env = dict(os.environ, MWMS_API=cluster.api, MWMS_TOKEN=cluster.admin_token, COLUMNS="200")
    listing = subprocess.run([MWMS, "agents"], capture_output=True, text=True, env=env, timeout=60)
    assert listing.returncode == 0, listing.stderr
    cells = next(line.split() for line in listing.stdout.splitlines() if line.split()[:1] == [name])
    return cells[3]  # NAME ID ADDRESS STATUS ...


def agents_gauge(cluster: Cluster, state: str) -> float:
    text = cluster.http.get("/metrics").text
    return next(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mwms_agents" and sample.labels == {"state": state}
    )


def test_a_sigtermed_agent_reads_stopped_not_lost_and_a_sigkilled_one_is_lost(
    goodbye_cluster: Cluster,
) -> None:
    cluster = goodbye_cluster
    server = cluster.server
    assert server is not None
    assert agents_gauge(cluster, "stopped") == 0
    job_id = cluster.submit(SLEEP, ["python", "sleep.py"], workers=1, agents=["bye-1"])
    cluster.wait_for(job_id, {"RUNNING"}, timeout=60)

    stopping = cluster.agents["bye-1"]
    stopping.popen.send_signal(signal.SIGTERM)  # the agent process only, as systemd's KillMode=mixed does
    assert stopping.popen.wait(30) == 0, stopping.log_tail()
    stopped_at = time.monotonic()
    shown = wait_until(
        lambda: (a := agent(cluster, "bye-1"))["state"] == "stopped" and a,
        10,
        "bye-1 to read as stopped",
        observed=lambda: (agent(cluster, "bye-1"), stopping.log_tail()),
    )
    assert not shown["online"] and shown["lost_at"] is None and shown["stopped_at"] is not None
    # Its task was stopped and reported before the goodbye: ended by the agent, not lost with it.
    (task,) = cluster.job(job_id)["tasks"]
    assert task["state"] in ("STOPPED", "FAILED"), task
    assert not processes_of_job(job_id)

    # An agent that dies without a word, heard from later than the stopped one: lost once the timeout
    # passes, and by then the stopped one would have been too.
    doomed = cluster.agents["bye-2"]
    os.killpg(doomed.popen.pid, signal.SIGKILL)
    doomed.popen.wait()
    wait_until(
        lambda: (a := agent(cluster, "bye-2"))["state"] == "lost" and a["lost_at"],
        AGENT_TIMEOUT_S + 15,
        "bye-2 to be lost",
        observed=server.log_tail,
    )
    # bye-2 may have been silent since before bye-1 stopped: let bye-1's timeout pass too, and a reconcile pass.
    time.sleep(max(0.0, stopped_at + AGENT_TIMEOUT_S + 2 - time.monotonic()))
    shown = agent(cluster, "bye-1")
    assert (shown["state"], shown["online"], shown["lost_at"]) == ("stopped", False, None), shown
    assert lost_series(cluster) == {"bye-2"}  # no series, so no MwmsAgentLost, for the stopped agent
    assert (cli_status(cluster, "bye-1"), cli_status(cluster, "bye-2")) == ("stopped", "lost")
    assert agents_gauge(cluster, "stopped") == 1 and agents_gauge(cluster, "lost") == 1

    # The stopped agent starts again and is back online.
    assert cluster.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    cluster.start_agent("bye-1", 25000)
    shown = agent(cluster, "bye-1")
    assert (shown["state"], shown["stopped_at"]) == ("online", None), shown
