"""Agent credentials end to end: real `mwms server` and `mwms agent` processes, and `mwms remove-agent`.

Uses its own cluster (one agent), since removing an agent would disturb the shared one.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms_testkit.cluster import MWMS, Cluster, Process, processes_of_job, wait_until
from mwms_testkit.parallel import port_range

pytestmark = pytest.mark.e2e
NAME = "auth-1"
PORT_LOW = 24000
SLEEPER = {"p.py": "import time\nprint('up', flush=True)\ntime.sleep(600)\n"}


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(
        root=tmp_path_factory.mktemp("agent-auth"),
        server_env={"MWMS_STOP_GRACE_S": "3", "MWMS_RESTART_BACKOFF_S": "1"},
    )
    try:
        cluster.start_server()
        cluster.start_agent(NAME, PORT_LOW)
        yield cluster
    finally:
        cluster.stop()


def spawn_agent(cluster: Cluster, log_name: str, work_dir: str, join_token: str | None) -> Process:
    args = ["agent", "--server", f"127.0.0.1:{cluster.grpc_port}", "--name", NAME]
    args += ["--work-dir", str(cluster.root / work_dir), "--slots", "1", "--advertise-address", "127.0.0.1"]
    args += ["--port-range", port_range(PORT_LOW)]
    return cluster._spawn(log_name, args, {"MWMS_JOIN_TOKEN": join_token or ""})


def exit_code(process: Process, timeout: float = 30) -> int:
    try:
        return process.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{process.name} did not exit:\n{process.log_tail()}") from None


def agent_record(cluster: Cluster) -> dict | None:
    return next((a for a in cluster.http.get("/api/v1/agents").json() if a["name"] == NAME), None)


def test_an_agent_joins_once_then_proves_itself_with_its_credential(auth_cluster: Cluster) -> None:
    path = auth_cluster.root / NAME / "agent-credential"
    record = agent_record(auth_cluster)
    assert record is not None
    credential = path.read_text().strip()
    assert credential.startswith(f"mwmsa_{record['id']}.")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = credential.split(".", 1)[1]
    assert auth_cluster.server is not None
    assert secret not in auth_cluster.agents[NAME].log_path.read_text()
    assert secret not in auth_cluster.server.log_path.read_text()

    auth_cluster.agents[NAME].stop()
    restarted = spawn_agent(auth_cluster, f"{NAME}-restarted", NAME, join_token=None)  # no join token
    auth_cluster.agents[NAME] = restarted
    wait_until(lambda: auth_cluster.agent_online(NAME), 60, f"{NAME} online again\n{restarted.log_tail()}")
    again = agent_record(auth_cluster)
    assert again is not None and again["id"] == record["id"]
    assert path.read_text().strip() == credential


def test_another_machine_cannot_take_a_registered_name(auth_cluster: Cluster) -> None:
    before = agent_record(auth_cluster)
    impostor = spawn_agent(auth_cluster, "impostor", "impostor-work-dir", join_token=auth_cluster.join_token)
    assert exit_code(impostor) == 2
    log = impostor.log_tail()
    assert "PERMISSION_DENIED" in log and "credential from its work dir" in log, log
    assert not (auth_cluster.root / "impostor-work-dir" / "agent-credential").exists()
    after = agent_record(auth_cluster)
    assert before is not None and after is not None
    assert (after["id"], after["hostname"], after["online"]) == (before["id"], before["hostname"], True)


def test_remove_agent_stops_its_tasks_and_the_agent_and_the_name_can_join_again(
    auth_cluster: Cluster,
) -> None:
    agent = auth_cluster.agents[NAME]
    record = agent_record(auth_cluster)
    assert record is not None
    job_id = auth_cluster.submit(SLEEPER, ["python", "p.py"], workers=1, name="on-a-removed-agent")
    auth_cluster.wait_for(job_id, {"RUNNING"}, timeout=60)
    assert processes_of_job(job_id)

    removed = subprocess.run(
        [MWMS, "remove-agent", NAME, "--api", auth_cluster.api, "--token", auth_cluster.admin_token],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert removed.returncode == 0, removed.stderr
    assert exit_code(agent) == 2  # its session ended and its credential is refused: it stops for good
    assert "removed by an admin" in agent.log_tail(80)
    wait_until(lambda: not processes_of_job(job_id), 30, "the removed agent's task processes to end")
    tasks = auth_cluster.job(job_id)["attempt_history"][0]["tasks"]
    assert [(t["state"], t["message"]) for t in tasks] == [
        ("LOST", "lost (its agent was removed by an admin)")
    ]
    assert agent_record(auth_cluster) is None

    # The old work dir still holds the void credential: without a join token the agent says what to do
    # and stops.
    stale = spawn_agent(auth_cluster, f"{NAME}-stale", NAME, join_token=None)
    assert exit_code(stale) == 2
    assert "agent-credential" in stale.log_tail() and "no longer valid" in stale.log_tail()

    # Given a join token, it falls back to it and joins again under its name.
    rejoined = spawn_agent(auth_cluster, f"{NAME}-rejoined", NAME, join_token=auth_cluster.join_token)
    auth_cluster.agents[NAME] = rejoined
    wait_until(lambda: auth_cluster.agent_online(NAME), 60, f"{NAME} rejoined\n{rejoined.log_tail()}")
    again = agent_record(auth_cluster)
    assert again is not None and again["id"] == record["id"]
    auth_cluster.wait_for(job_id, {"RUNNING"}, timeout=60)  # the job restarted on the agent that came back
    auth_cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
    wait_until(lambda: not processes_of_job(job_id), 30, "the job's processes to end after the cancel")


def test_an_agent_takes_its_join_token_from_a_file_and_refuses_one_on_its_command_line(
    auth_cluster: Cluster,
) -> None:
    # Last in the module: this second agent is stopped at the end and cannot take the tests' jobs.
    name, work_dir, token = "auth-file", auth_cluster.root / "auth-file", auth_cluster.join_token
    args = ["agent", "--server", f"127.0.0.1:{auth_cluster.grpc_port}", "--name", name]
    args += [
        "--work-dir",
        str(work_dir),
        "--advertise-address",
        "127.0.0.1",
        "--port-range",
        port_range(24200),
    ]
    environment = {k: v for k, v in os.environ.items() if k != "MWMS_JOIN_TOKEN"}
    refused = subprocess.run(
        [MWMS, *args, "--join-token", token], capture_output=True, text=True, timeout=60, env=environment
    )
    assert refused.returncode == 2, refused.stderr
    assert "MWMS_JOIN_TOKEN" in refused.stderr and "--join-token-file" in refused.stderr
    assert token not in refused.stdout + refused.stderr
    assert not work_dir.exists()

    token_file = auth_cluster.root / "join-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    agent = auth_cluster._spawn(name, [*args, "--join-token-file", str(token_file)])
    try:
        wait_until(lambda: auth_cluster.agent_online(name), 60, f"{name} online\n{agent.log_tail()}")
        assert token not in Path(f"/proc/{agent.popen.pid}/cmdline").read_text()
        assert stat.S_IMODE(work_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((work_dir / "agent-credential").stat().st_mode) == 0o600
    finally:
        agent.stop()
    assert token not in agent.log_path.read_text()


def test_an_agent_named_like_another_agents_id_is_refused_and_told_what_to_do(auth_cluster: Cluster) -> None:
    record = agent_record(auth_cluster)
    assert record is not None
    args = ["agent", "--server", f"127.0.0.1:{auth_cluster.grpc_port}", "--name", record["id"]]
    args += ["--work-dir", str(auth_cluster.root / "id-named"), "--slots", "1"]
    args += ["--advertise-address", "127.0.0.1", "--port-range", port_range(PORT_LOW + 200)]
    rogue = auth_cluster._spawn("id-named", args, {"MWMS_JOIN_TOKEN": auth_cluster.join_token})
    assert exit_code(rogue) == 2
    log = rogue.log_tail()
    assert "INVALID_ARGUMENT" in log and "form of an agent id" in log and "--name" in log, log
    names = [a["name"] for a in auth_cluster.http.get("/api/v1/agents").json()]
    assert record["id"] not in names and NAME in names
    # The real agent is still the one its id names.
    devices = auth_cluster.http.get(f"/api/v1/agents/{record['id']}/devices")
    assert devices.status_code == 200 and devices.json()["agent_id"] == record["id"]
