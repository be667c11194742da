"""A network partition on a real cluster: each agent in its own Linux network namespace on a bridge.

Cutting one agent's link mid-job must be detected (the agent stops heartbeating), the job must move to the
two agents still connected and resume from its checkpoint, and once the link is back the cut agent must
rejoin with no process of the old task left. TensorFlow itself usually aborts that task about 10 s after the
cut (its coordination-service heartbeat); otherwise the coordinator stops it when the agent reconnects. The
test prints which happened. Needs root; skipped otherwise (see testkit/mwms_testkit/netns.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any

import httpx
import pytest

from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import MWMS, TERMINAL, Cluster, Process, pack_dir, processes_of_job, wait_until
from mwms_testkit.netns import Netns, require_netns

pytestmark = [pytest.mark.e2e, pytest.mark.tf]
PROGRAM = pack_dir(PROGRAMS / "resumable")
AGENT_TIMEOUT_S = 4
AGENTS = 3
# Proxies must never see traffic meant for the bridge.
PROXY_VARIABLES = {"http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy"}


class NetnsCluster(Cluster):
    """A Cluster whose coordinator listens on the bridge address and whose agent i runs in namespace i."""

    def __init__(self, net: Netns, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.net = net

    @property
    def api(self) -> str:
        return f"http://{self.net.bridge_address}:{self.http_port}"

    def _healthy(self) -> bool:
        assert self.server is not None
        if self.server.popen.poll() is not None:
            raise AssertionError(f"coordinator exited:\n{self.server.log_tail()}")
        try:
            return self.http.get("/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _spawn_argv(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> Process:
        log_path = self.root / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES and k != "TF_CONFIG"}
        env.update(PYTHONUNBUFFERED="1", **(extra_env or {}))
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return Process(name, popen, log_path)

    def server_args(self) -> list[str]:
        return ["--host", self.net.bridge_address]

    def spawn_server(self, args: list[str]) -> Process:
        return self._spawn_argv("server", [MWMS, *args], self.server_environment())

    def start_agent_in(self, i: int) -> Process:
        """Starts agent net-i inside namespace i, advertising that namespace's address."""
        name = f"net-{i}"
        # `ip netns exec` execs the agent, so the Popen pid is the agent's and SIGTERM reaches it.
        agent = self._spawn_argv(
            name,
            self.net.run_in(
                i,
                [
                    MWMS,
                    "agent",
                    "--server",
                    f"{self.net.bridge_address}:{self.grpc_port}",
                    "--name",
                    name,
                    "--work-dir",
                    str(self.root / name),
                    "--slots",
                    "1",
                    "--advertise-address",
                    self.net.address(i),
                    "--port-range",
                    "24000-24099",
                ],
            ),
            self.agent_environment(),
        )
        self.agents[name] = agent
        wait_until(lambda: self.agent_online(name), 60, f"agent {name} online\n{agent.log_tail()}")
        return agent


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory):
    net = require_netns(AGENTS)
    cluster = NetnsCluster(
        net,
        root=tmp_path_factory.mktemp("netns"),
        server_env={
            "MWMS_AGENT_TIMEOUT_S": str(AGENT_TIMEOUT_S),
            "MWMS_STOP_GRACE_S": "3",
            "MWMS_RESTART_BACKOFF_S": "1",
        },
    )
    try:
        cluster.start_server()
        for i in range(AGENTS):
            cluster.start_agent_in(i)
        yield cluster
    finally:
        cluster.stop()
        net.teardown()


def resumed_steps(cluster: Cluster, job_id: str, attempt: int) -> list[int]:
    lines = [x["text"] for x in cluster.logs(job_id) if x["attempt"] == attempt]
    return [int(n) for line in lines for n in re.findall(r"RESUMED (\d+)", line)]


def job_pids_in(cluster: NetnsCluster, i: int, job_id: str) -> list[int]:
    """Live processes of the job inside namespace i."""
    return sorted(set(processes_of_job(job_id)) & set(cluster.net.pids(i)))


def test_cut_link_is_detected_and_the_job_recovers_on_the_connected_agents(partitioned):
    cluster = partitioned
    job_id = cluster.submit(
        PROGRAM,
        ["python", "train.py", "--steps", "200", "--every", "10", "--delay", "0.05"],
        workers=2,
        name="cut-a-link",
    )
    wait_until(
        lambda: any(p["step"] >= 10 for p in cluster.metrics(job_id, name="loss")),
        120,
        f"step 10 of {job_id}",
    )
    victim_task = next(t for t in cluster.job(job_id)["tasks"] if t["index"] == 1)
    victim = int(victim_task["agent_name"].removeprefix("net-"))
    cluster.net.cut(victim)
    cut_at = time.monotonic()

    first = wait_until(
        lambda: (a := cluster.job(job_id)["attempt_history"][0])["state"] != "ACTIVE" and a,
        AGENT_TIMEOUT_S + 10,
        "the attempt to end after the link was cut",
    )
    detected_s = time.monotonic() - cut_at
    assert detected_s <= AGENT_TIMEOUT_S + 3, f"took {detected_s:.1f} s: {first}"
    assert f"agent net-{victim}" in first["reason"] and "lost" in first["reason"], first["reason"]

    job = cluster.wait_for(job_id, TERMINAL, timeout=240)
    recovered_s = time.monotonic() - cut_at
    assert job["state"] == "SUCCEEDED", f"{job['reason']}\n{cluster.logs_text(job_id)}"
    assert len(job["attempt_history"]) == 2, job["attempt_history"]
    placed = {t["agent_name"] for t in job["tasks"]}
    assert placed == {f"net-{i}" for i in range(AGENTS) if i != victim}, placed
    resumed = resumed_steps(cluster, job_id, 2)
    assert len(resumed) == 2 and resumed[0] == resumed[1] and resumed[0] >= 10, (
        f"attempt 2 did not resume from a saved step: RESUMED {resumed}\n{cluster.logs_text(job_id)}"
    )

    left_running = victim_task["pid"] in job_pids_in(cluster, victim, job_id)
    cluster.net.restore(victim)
    restored_at = time.monotonic()
    agent_log = cluster.agents[f"net-{victim}"]
    try:
        wait_until(lambda: cluster.agent_online(f"net-{victim}"), 30, f"agent net-{victim} online again")
        online_s = time.monotonic() - restored_at
        wait_until(lambda: not job_pids_in(cluster, victim, job_id), 30, f"the old task of {job_id} to end")
    except AssertionError as error:
        raise AssertionError(f"{error}\nagent log ({agent_log.log_path}):\n{agent_log.log_tail()}") from None
    print(
        f"detected in {detected_s:.1f} s, succeeded {recovered_s:.1f} s after the cut (resumed from "
        f"{resumed[0]}); old task still running at restore: {left_running}; agent online {online_s:.1f} s "
        f"and old task gone {time.monotonic() - restored_at:.1f} s after the restore"
    )
