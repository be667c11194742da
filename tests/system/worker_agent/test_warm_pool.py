"""Warm starts (worker_agent/warm_pool.py): a real coordinator and agent, real sandboxed TensorFlow tasks.

One agent keeps one warm interpreter. Its tasks must see what a cold `python train.py` sees (argv,
sys.path[0], cwd, the job's environment and none of the agent's), exit as it would, stop on SIGTERM, and
each handout is replaced; a job whose variables change TensorFlow's import starts cold, saying why, and
the coordinator counts both kinds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

try:
    from mwms_testkit.cluster import MWMS, Cluster, wait_until
except ImportError:  # the scaffolding before its move into mwms_testkit
    from cluster import MWMS, Cluster, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.tf]

# Prints what a cold start would show of the process, then takes a few steps of a tiny model.
PROBE = """
import json, os, sys
import tensorflow as tf
print("PROBE " + json.dumps({
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "file": __file__,
    "main": __name__,
    "job_var": os.environ.get("WARM_TEST_VAR"),
    "agent_var": os.environ.get("WARM_AGENT_TOKEN"),
    "tmpdir": os.environ.get("TMPDIR"),
    "task_id": os.environ.get("MWMS_TASK_ID"),
    "uid": os.getuid(),
    "pids": len([p for p in os.listdir("/proc") if p.isdigit()]),
    "cgroup": open("/proc/self/cgroup").read(),
}), flush=True)
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile(optimizer="sgd", loss="mse")
model.fit(tf.ones((8, 2)), tf.zeros((8, 1)), epochs=2, verbose=0)
print("TRAINED", flush=True)
code = int(os.environ.get("WARM_EXIT", "0"))
if code:
    sys.exit(code)
if os.environ.get("WARM_RAISE"):
    raise ValueError("on purpose")
"""

SLEEPER = """
import signal, sys, time
import tensorflow as tf
def stopped(signum, frame):
    print("GOT SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
print("SLEEPING", flush=True)
time.sleep(300)
"""


@pytest.fixture(scope="module")
def warm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A coordinator and one agent keeping one warm interpreter (and a secret-like variable of its own,
    which tasks must not see)."""
    root = tmp_path_factory.mktemp("warm")
    instance = Cluster(root=root)
    os.environ["WARM_AGENT_TOKEN"] = "agent-secret-ish"
    try:
        instance.start_server()
        instance.start_agent("warm-1", 23000, extra_args=["--warm-pool", "1"])
        yield instance
    finally:
        os.environ.pop("WARM_AGENT_TOKEN", None)
        instance.stop()


def wait_warm_ready(cluster: Cluster) -> None:
    """Until the agent log says its warm interpreter imported TensorFlow."""
    agent = cluster.agents["warm-1"]

    def ready() -> bool:
        text = agent.log_path.read_text(errors="replace")
        return text.count("ready in") > wait_warm_ready.seen  # type: ignore[attr-defined]

    wait_until(ready, 120, "a warm interpreter ready", observed=agent.log_tail)
    wait_warm_ready.seen += 1  # type: ignore[attr-defined]


wait_warm_ready.seen = 0  # type: ignore[attr-defined]


def run_job(cluster: Cluster, program: str, args: list[str], env: dict[str, str], state: str) -> dict:
    job_id = cluster.submit({"train.py": program}, ["python", "train.py", *args], workers=1, env=env)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    assert job["state"] == state, job["reason"] + "\n" + cluster.logs_text(job_id)
    job["text"] = cluster.logs_text(job_id)
    return job


def probe_of(text: str) -> dict:
    match = re.search(r"PROBE (.*)", text)
    assert match, text
    return json.loads(match.group(1))


def starts(cluster: Cluster) -> dict[str, float]:
    """mwms_task_starts_total by kind, from the coordinator's /metrics."""
    text = cluster.http.get("/metrics").text
    found = {}
    for kind in ("warm", "cold"):
        match = re.search(rf'^mwms_task_starts_total{{kind="{kind}"}} (\S+)$', text, re.M)
        found[kind] = float(match.group(1)) if match else 0.0
    return found


def test_a_warm_task_sees_what_a_cold_start_shows_and_each_handout_is_replaced(warm_cluster):
    wait_warm_ready(warm_cluster)
    before = starts(warm_cluster)
    warm = run_job(warm_cluster, PROBE, ["--lr", "0.1"], {"WARM_TEST_VAR": "from-the-job"}, "SUCCEEDED")
    assert "mwms-agent: warm start" in warm["text"], warm["text"]
    assert "TRAINED" in warm["text"]
    seen = probe_of(warm["text"])
    assert seen["argv"] == ["train.py", "--lr", "0.1"]
    assert seen["cwd"].endswith("/bundle") and seen["path0"] == seen["cwd"], seen
    assert seen["file"] == os.path.join(seen["cwd"], "train.py") and seen["main"] == "__main__"
    assert seen["job_var"] == "from-the-job" and seen["agent_var"] is None
    assert seen["tmpdir"] == os.path.join(os.path.dirname(seen["cwd"]), "tmp")
    assert seen["task_id"] == warm["tasks"][0]["id"]  # the task's variables, not the warm pool's
    # Confined as a cold task is: a task uid, its own PID namespace, a task cgroup.
    assert 60000 <= seen["uid"] <= 60999 and seen["pids"] <= 4, seen
    assert "mwms-tasks-" in seen["cgroup"], seen["cgroup"]
    assert starts(warm_cluster)["warm"] == before["warm"] + 1

    # The same program cold (a variable read at TensorFlow's import): the same view, and the reason.
    cold_env = {"WARM_TEST_VAR": "from-the-job", "TF_CPP_MIN_LOG_LEVEL": "1"}
    cold = run_job(warm_cluster, PROBE, ["--lr", "0.1"], cold_env, "SUCCEEDED")
    assert "mwms-agent: cold start: the job sets TF_CPP_MIN_LOG_LEVEL" in cold["text"], cold["text"]
    assert "mwms-agent: warm start" not in cold["text"]
    cold_seen = probe_of(cold["text"])
    assert cold_seen["argv"] == seen["argv"] and cold_seen["agent_var"] is None
    assert 60000 <= cold_seen["uid"] <= 60999 and cold_seen["pids"] <= 4, cold_seen
    assert cold_seen["path0"] == cold_seen["cwd"] and cold_seen["file"] == os.path.join(
        cold_seen["cwd"], "train.py"
    )
    assert starts(warm_cluster)["cold"] == before["cold"] + 1

    # The interpreter the first job used was replaced: the next job starts warm too.
    wait_warm_ready(warm_cluster)
    again = run_job(warm_cluster, PROBE, [], {}, "SUCCEEDED")
    assert "mwms-agent: warm start" in again["text"], again["text"]
    assert probe_of(again["text"])["cwd"] != seen["cwd"]  # a task dir of its own


def test_exit_codes_and_tracebacks_are_a_cold_starts(warm_cluster):
    wait_warm_ready(warm_cluster)
    failed = run_job(warm_cluster, PROBE, [], {"WARM_EXIT": "3"}, "FAILED")
    assert "mwms-agent: warm start" in failed["text"], failed["text"]
    assert failed["tasks"][0]["exit_code"] == 3, failed["tasks"]

    wait_warm_ready(warm_cluster)
    raised = run_job(warm_cluster, PROBE, [], {"WARM_RAISE": "1"}, "FAILED")
    assert "mwms-agent: warm start" in raised["text"], raised["text"]
    assert raised["tasks"][0]["exit_code"] == 1
    trace = raised["text"][raised["text"].index("Traceback") :]
    assert "ValueError: on purpose" in trace and "warm_interpreter" not in trace, trace


def test_a_warm_task_answers_for_its_stacks_and_stops_on_sigterm(warm_cluster):
    wait_warm_ready(warm_cluster)
    job_id = warm_cluster.submit({"train.py": SLEEPER}, ["python", "train.py"], workers=1)
    wait_until(
        lambda: "SLEEPING" in warm_cluster.logs_text(job_id),
        120,
        "the warm task to run",
        observed=lambda: warm_cluster.logs_text(job_id),
    )
    assert "mwms-agent: warm start" in warm_cluster.logs_text(job_id)
    # Its files are where a cold start's would be, through a link to the warm interpreter's task dir.
    usual = warm_cluster.root / "warm-1" / "jobs" / job_id / "attempt-1" / "task-0"
    assert usual.is_symlink() and "/warm/slots/" in os.readlink(usual), usual
    assert (usual / "bundle" / "train.py").is_file()
    target = Path(os.readlink(usual))
    # Its stacks on demand, as a cold task's: the program's own frames, innermost first.
    dumps = warm_cluster.http.post(f"/api/v1/jobs/{job_id}/stacks")
    assert dumps.status_code == 200, dumps.text
    [task] = dumps.json()["tasks"]
    assert task["answered"] and task["error"] == "", task
    frames = task["threads"][0]["frames"]
    assert "train.py" in frames[-1] and "warm_interpreter" not in frames[-1], frames

    response = warm_cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code in (200, 202), response.text
    job = warm_cluster.wait_for(job_id, {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
    assert job["state"] == "CANCELLED", job
    wait_until(
        lambda: warm_cluster.job(job_id)["tasks"][0]["state"] == "STOPPED",
        60,
        "the task to stop",
        observed=lambda: warm_cluster.job(job_id)["tasks"],
    )
    # The program's own handler ran: SIGTERM reached it, not only its sandbox.
    wait_until(
        lambda: "GOT SIGTERM" in warm_cluster.logs_text(job_id),
        30,
        "the program's SIGTERM handler",
        observed=lambda: warm_cluster.logs_text(job_id),
    )
    # Forgotten once acknowledged: its files and the link go.
    wait_until(lambda: not usual.is_symlink() and not target.exists(), 60, "the task's files removed")


def test_the_pool_and_its_memory_are_in_the_agent_list(warm_cluster):
    wait_warm_ready(warm_cluster)

    def reported() -> dict | None:
        [agent] = warm_cluster.http.get("/api/v1/agents").json()
        pool = agent.get("warm_pool") or {}
        return pool if pool.get("ready") == 1 and pool.get("memory_bytes", 0) > 100 * 1024**2 else None

    pool = wait_until(
        reported,
        60,
        "the warm pool in the agent list",
        observed=lambda: warm_cluster.http.get("/api/v1/agents").json(),
    )
    assert pool["size"] == 1 and pool["memory_bytes"] < 4 * 1024**3, (
        pool
    )  # TensorFlow imported: a few 100 MiB
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    env.update(MWMS_API=warm_cluster.api, MWMS_TOKEN=warm_cluster.admin_token, COLUMNS="250")
    shown = subprocess.run([MWMS, "agents"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "WARM" in shown.stdout and "1/1 (" in shown.stdout, shown.stdout


def test_a_task_placed_while_the_replacement_imports_takes_it_rather_than_starting_cold(warm_cluster):
    # Two jobs back to back on the agent's one slot: the second is placed as the first ends, while the
    # interpreter that replaced the first one's is (most often) still importing TensorFlow. It waits for the
    # rest of that import instead of paying a whole one cold.
    def pool_ready() -> bool:
        agents = warm_cluster.http.get("/api/v1/agents").json()
        return all((agent.get("warm_pool") or {}).get("ready") == 1 for agent in agents)

    wait_until(pool_ready, 120, "the warm interpreter ready")
    first = warm_cluster.submit({"train.py": "print('first')\n"}, ["python", "train.py"], workers=1)
    second = warm_cluster.submit({"train.py": "print('second')\n"}, ["python", "train.py"], workers=1)
    for job_id in (first, second):
        job = warm_cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
        text = warm_cluster.logs_text(job_id)
        assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + text
        assert "mwms-agent: warm start" in text, text
