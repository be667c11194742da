"""Stack dumps on demand and hang detection on a real cluster: a coordinator and two agents as processes,
one agent taking stacks with py-spy (when it can trace here), the other forced to the faulthandler handler
(MWMS_AGENT_STACK_METHOD=faulthandler), and real task processes (plain Python, and a real 2-worker
TensorFlow job whose worker 1 sleeps before its first all-reduce)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mwms.worker_agent.stacks import py_spy_executable
from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import MWMS, Cluster, pack_dir, wait_until

pytestmark = pytest.mark.e2e
STRAGGLER = pack_dir(PROGRAMS / "straggler")
FAULTHANDLER_AGENT = "stk-fh"
AUTO_AGENT = "stk-auto"

# Both workers print WAITING, then stay where they are: worker 1 sleeps in a named function.
SLEEPERS = (PROGRAMS / "sleepers" / "main.py").read_text()


SERVER_HANG_TIMEOUT_S = 4


class StacksCluster(Cluster):
    """A coordinator started with `--hang-timeout` (its default for jobs that set none), and agents started
    with MWMS_AGENT_STACK_METHOD=faulthandler when their name says so."""

    starting: str = ""

    def server_args(self) -> list[str]:
        return ["--hang-timeout", str(SERVER_HANG_TIMEOUT_S)]

    def agent_environment(self) -> dict[str, str]:
        env = super().agent_environment()
        if self.starting == FAULTHANDLER_AGENT:
            env["MWMS_AGENT_STACK_METHOD"] = "faulthandler"
        return env

    def start_agent(self, name: str, port_low: int, slots: int = 1):  # type: ignore[no-untyped-def]
        self.starting = name
        return super().start_agent(name, port_low, slots)


@pytest.fixture(scope="module")
def stk(tmp_path_factory):
    cluster = StacksCluster(
        root=tmp_path_factory.mktemp("stacks"),
        server_env={"MWMS_STOP_GRACE_S": "2", "MWMS_RESTART_BACKOFF_S": "1"},
    )
    try:
        cluster.start_server()
        cluster.start_agent(AUTO_AGENT, 24000)
        cluster.start_agent(FAULTHANDLER_AGENT, 24100)
        yield cluster
    finally:
        cluster.stop()


def py_spy_traces_here() -> bool:
    executable = py_spy_executable()
    if executable is None:
        return False
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)  # let the interpreter start; py-spy needs its runtime in memory
        done = subprocess.run(
            [executable, "dump", "--pid", str(sleeper.pid)], capture_output=True, timeout=20
        )
        return done.returncode == 0
    finally:
        sleeper.kill()
        sleeper.wait()


def wait_for_waiting(cluster: Cluster, job_id: str, timeout: float = 120) -> None:
    def both_waiting() -> bool:
        job = cluster.job(job_id)
        if job["state"] in {"FAILED", "SUCCEEDED", "CANCELLED"}:
            raise AssertionError(f"job ended: {job['reason']}\n{cluster.logs_text(job_id)}")
        text = {i: cluster.logs_text(job_id, i) for i in (0, 1)}
        return job["state"] == "RUNNING" and all("WAITING" in t for t in text.values())

    wait_until(both_waiting, timeout, f"both workers of {job_id} WAITING")


def mwms_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    env.update(MWMS_API=cluster.api, MWMS_TOKEN=cluster.admin_token, COLUMNS="200")
    return subprocess.run([MWMS, *args], capture_output=True, text=True, env=env, timeout=60)


def by_index(dumps: dict) -> dict[int, dict]:
    return {task["task_index"]: task for task in dumps["tasks"]}


def what_the_hang_saw(cluster: Cluster, job_id: str, reason: str) -> str:
    """For a failed assertion on a hang's reason: the reason whole, and what each worker's snapshots of the
    newest dump showed (each thread's innermost frames)."""
    dumps = cluster.http.get(f"/api/v1/jobs/{job_id}/stacks").json()
    lines = [f"reason: {reason}"]
    for task in sorted(dumps.get("tasks", []), key=lambda t: t["task_index"]):
        lines.append(
            f"worker {task['task_index']} on {task['agent_name']}: {task['method']}, "
            f"in_collective={task['in_collective']}, error={task.get('error')}"
        )
        for line in (task.get("text") or "").splitlines():
            if line.startswith(("===", "Thread", "Current thread", "  File", "    ", "  Garbage")):
                lines.append("  " + line[:200])
    return "\n".join(lines)


def check_method(task: dict) -> None:
    if task["agent_name"] == FAULTHANDLER_AGENT:
        assert task["method"] == "faulthandler", task
    elif py_spy_traces_here():
        assert task["method"] == "py-spy", task
    else:
        assert task["method"] == "faulthandler", task  # py-spy may not trace here: the fallback answered


def test_stacks_of_every_task_at_once_on_both_paths(stk):
    # 0 turns hang detection off for this job, although the coordinator's default is on.
    job_id = stk.submit(
        {"main.py": SLEEPERS}, ["python", "main.py"], workers=2, name="sleepers", hang_timeout_seconds=0
    )
    wait_for_waiting(stk, job_id)
    waiting_seen = time.monotonic()

    response = stk.http.post(f"/api/v1/jobs/{job_id}/stacks")
    assert response.status_code == 200, response.text
    dumps = response.json()
    taken = time.monotonic()
    # One dump per job every 2 s: a second one at once is refused, saying where the last one is.
    again = stk.http.post(f"/api/v1/jobs/{job_id}/stacks")
    assert again.status_code == 429 and "one dump per job every 2 s" in again.json()["detail"], again.text
    assert dumps["cause"] == "request" and dumps["complete"] and dumps["attempt"] == 1
    tasks = by_index(dumps)
    assert set(tasks) == {0, 1}
    assert {t["agent_name"] for t in tasks.values()} == {AUTO_AGENT, FAULTHANDLER_AGENT}
    job = stk.job(job_id)
    for index, task in tasks.items():
        assert task["answered"] and task["error"] == "", task
        check_method(task)
        # The Python process of the task: its group leader, or in a sandbox a member of its group.
        leader = next(t["pid"] for t in job["tasks"] if t["index"] == index)
        assert task["pid"] == leader or os.getpgid(task["pid"]) == leader, (task["pid"], leader)
        assert task["in_collective"] is False
        main = task["threads"][0]
        expected = "wait_before_first_allreduce" if index == 1 else "read_input_forever"
        assert expected in main["frames"][0], main  # innermost frame first
        assert "main.py" in main["frames"][-1]

    # Stored with the attempt: GET shows the newest, or one by id; a viewer may read but not take them.
    latest = stk.http.get(f"/api/v1/jobs/{job_id}/stacks").json()
    assert latest["id"] == dumps["id"] and by_index(latest)[1]["threads"] == tasks[1]["threads"]
    viewer = stk.client(stk.create_token("stacks-viewer", role="viewer"))
    assert viewer.get(f"/api/v1/jobs/{job_id}/stacks", params={"request": dumps["id"]}).status_code == 200
    assert viewer.post(f"/api/v1/jobs/{job_id}/stacks").status_code == 403
    assert stk.http.get(f"/api/v1/jobs/{job_id}/stacks", params={"request": "nope"}).status_code == 404

    # The CLI: a new dump printed per task, the last one as JSON, and its exit codes.
    time.sleep(max(0.0, taken + 2.1 - time.monotonic()))  # past the interval between two dumps of a job
    shown = mwms_cli(stk, "stacks", job_id)
    assert shown.returncode == 0, shown.stderr
    assert f"worker 1  agent {tasks[1]['agent_name']}  pid {tasks[1]['pid']}" in shown.stdout, shown.stdout
    assert "in collective: NO" in shown.stdout and "wait_before_first_allreduce" in shown.stdout
    assert (
        shown.stdout.index("worker 0")
        < shown.stdout.index("read_input_forever")
        < shown.stdout.index("worker 1")
    )
    last = json.loads(mwms_cli(stk, "stacks", job_id, "--no-refresh", "--json").stdout)
    assert last["id"] != dumps["id"] and last["requested_by"] == "admin" and last["complete"]
    assert mwms_cli(stk, "stacks", "no-such-job").returncode == 4
    # Silent for longer than the coordinator's default: still running, as the job turned detection off.
    while time.monotonic() - waiting_seen < SERVER_HANG_TIMEOUT_S + 3:
        assert stk.job(job_id)["state"] == "RUNNING", stk.job(job_id)["reason"]
        time.sleep(0.5)

    assert stk.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    stk.wait_for(job_id, {"CANCELLED"})
    refused = stk.http.post(f"/api/v1/jobs/{job_id}/stacks")
    assert refused.status_code == 409 and "no running attempt" in refused.json()["detail"], refused.text
    after_end = mwms_cli(stk, "stacks", job_id)
    assert after_end.returncode == 2 and "no running attempt" in after_end.stderr, after_end.stderr


def test_a_job_without_progress_fails_by_its_policy_naming_the_workers(stk):
    timeout_s = SERVER_HANG_TIMEOUT_S  # the coordinator's default (mwms server --hang-timeout)
    job_id = stk.submit(
        {"main.py": SLEEPERS}, ["python", "main.py"], workers=2, name="hangs", restart={"max_restarts": 0}
    )
    wait_for_waiting(stk, job_id)
    waiting_seen = time.monotonic()
    job = stk.wait_for(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=60)
    took = time.monotonic() - waiting_seen
    assert job["state"] == "FAILED", job["reason"]
    assert took <= timeout_s + 10, f"flagged {took:.1f} s after both workers waited"
    reason = job["reason"]
    assert reason.startswith(f"no progress for {timeout_s} s"), reason
    assert "not in a collective: worker 0 on agent" in reason and "worker 1 on agent" in reason, reason
    assert "in wait_before_first_allreduce" in reason, reason
    dumps = stk.http.get(f"/api/v1/jobs/{job_id}/stacks").json()
    assert dumps["cause"] == "hang" and dumps["requested_by"] == "hang detection"
    assert all(t["answered"] and t["in_collective"] is False for t in dumps["tasks"]), dumps


@pytest.mark.tf
def test_a_straggler_before_its_first_all_reduce_is_named_and_the_job_restarts_then_fails(stk):
    timeout_s = 15
    job_id = stk.submit(
        STRAGGLER,
        ["python", "train.py", "--sleep", "600"],
        workers=2,
        name="straggler",
        hang_timeout_seconds=timeout_s,
        restart={"max_restarts": 1},
    )
    wait_for_waiting(stk, job_id, timeout=180)

    def worker0_in_collective():
        response = stk.http.post(f"/api/v1/jobs/{job_id}/stacks")
        if response.status_code == 429:  # the last dump was taken less than 2 s ago
            return None
        dumps = response.json()
        return dumps if by_index(dumps)[0]["in_collective"] else None

    # Worker 0 reaches the collective a moment after it printed WAITING (tracing the step first).
    dumps = wait_until(worker0_in_collective, 30, "worker 0 waiting in the collective", interval=2.1)
    tasks = by_index(dumps)
    assert tasks[1]["in_collective"] is False, tasks[1]
    assert "wait_before_first_allreduce" in tasks[1]["threads"][0]["frames"][0], tasks[1]["threads"]
    assert any(t["in_collective"] for t in tasks[0]["threads"]), tasks[0]["threads"]

    def restarted():
        job = stk.job(job_id)
        return job if job["state"] in {"RESTARTING", "PENDING", "SCHEDULED"} or job["restarts"] else None

    job = wait_until(restarted, timeout_s + 60, "the hang to restart the job")
    hang = next(e for e in job["events"] if e["to_state"] == "RESTARTING")
    saw = what_the_hang_saw(stk, job_id, hang["reason"])
    assert hang["reason"].startswith(f"no progress for {timeout_s} s"), saw
    assert "not in a collective: worker 1 on agent" in hang["reason"], saw
    assert "worker 0" not in hang["reason"].split("not in a collective")[1], saw
    assert "restart 1 of 1" in hang["reason"], saw

    job = stk.wait_for(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=240)
    assert job["state"] == "FAILED" and "(all 1 restarts used)" in job["reason"], job["reason"]
    # The second attempt's check counts from its start: on a slow machine worker 0 may still be importing
    # TensorFlow then, and is named too; worker 1, sleeping or importing, is outside a collective either way.
    outside = job["reason"].split("not in a collective: ", 1)
    assert len(outside) == 2 and "worker 1 on agent" in outside[1], job["reason"]
    assert len(job["attempt_history"]) == 2
