"""A job reaches nothing but its own task: probes of a hostile `user` job against real agents.

Each probe runs inside a task of the attacker's job on the shared cluster (real coordinator, real agents;
root in CI, so the task user and bubblewrap are exercised) and must fail, with nothing changed: the
agent's credential and join token, the bundle cache, another user's running task and old outputs, the
system, the agent's process.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

import pytest

from mwms.worker_agent.sandbox import needed_paths
from mwms_testkit.cluster import TERMINAL, pack, wait_until

pytestmark = pytest.mark.e2e

VICTIM = """
import os, time
open(os.path.join(os.environ["MWMS_OUTPUT_DIR"], "victim-output.txt"), "w").write(os.environ["VICTIM_SECRET"])
print("victim running as", os.getuid(), flush=True)
deadline = time.time() + float(os.environ.get("VICTIM_SECONDS", "0"))
while time.time() < deadline:
    time.sleep(0.1)
"""

PROBE = r"""
import json, os, pathlib, signal
results = {}

def attempt(name, action):
    try:
        results[name] = {"ok": True, "value": repr(action())[:300]}
    except Exception as error:
        results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}

work_dir = pathlib.Path(os.environ["PROBE_WORK_DIR"])
agent_pid = int(os.environ["PROBE_AGENT_PID"])
task_dir = pathlib.Path(os.environ["MWMS_OUTPUT_DIR"]).parent
attempt("read_credential", lambda: (work_dir / "agent-credential").read_text())
attempt("walk_up_to_credential", lambda: (task_dir / ".." / ".." / ".." / ".." / "agent-credential").read_text())
attempt("list_bundle_cache", lambda: os.listdir(work_dir / "bundles"))
attempt("overwrite_cached_bundle", lambda: (work_dir / "bundles" / os.environ["PROBE_DIGEST"]).write_bytes(b"evil"))
attempt("read_agent_cmdline", lambda: open(f"/proc/{agent_pid}/cmdline", "rb").read())
attempt("read_agent_environ", lambda: open(f"/proc/{agent_pid}/environ", "rb").read())
attempt("signal_agent", lambda: os.kill(agent_pid, 0))
attempt("list_other_jobs", lambda: os.listdir(work_dir / "jobs"))
attempt("read_victim_output", lambda: open(os.environ["PROBE_VICTIM_OUTPUT"]).read())
attempt("write_system", lambda: open("/etc/mwms-probe", "w"))
attempt("become_root", lambda: os.setuid(0))
attempt("write_own_bundle", lambda: open("train.py", "a"))
hits = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():  # its own environ holds the mark it looks for
        try:
            data = open(f"/proc/{pid}/environ", "rb").read() + open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if os.environ["PROBE_SECRET_MARK"].encode() in data or b"MWMS_JOIN_TOKEN" in data or b"--join-token" in data:
            hits.append(pid)
results["secrets_in_proc"] = hits
results["uid"] = os.getuid()
results["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
results["tmp"] = sorted(os.listdir("/tmp"))
results["own_dirs_writable"] = all(
    os.access(os.environ[name], os.W_OK) for name in ("MWMS_OUTPUT_DIR", "MWMS_CHECKPOINT_DIR", "TMPDIR", "HOME")
)
print("PROBE " + json.dumps(results), flush=True)
"""


def submit_as(cluster, token: str, files: dict[str, str], command: list[str], **spec: Any) -> str:
    with cluster.client(token) as client:
        upload = client.post("/api/v1/bundles", files={"file": ("bundle.tar.gz", pack(files))})
        assert upload.status_code in (200, 201), upload.text
        body = {"bundle_digest": upload.json()["digest"], "command": command, "workers": 1, **spec}
        response = client.post("/api/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        return response.json()["id"]


def task_dirs_of(root: Path, job_id: str) -> list[Path]:
    return sorted(root.glob(f"*/jobs/{job_id}/attempt-*/task-*"))


def test_a_hostile_job_reaches_nothing_but_its_own_task(cluster) -> None:
    secret = "s3cr3t-" + secrets.token_hex(8)
    victim_token, attacker_token = cluster.create_token("victim"), cluster.create_token("mallory")

    # The victim's first job ends and leaves its output; its second one runs while the attacker probes.
    done_id = submit_as(
        cluster,
        victim_token,
        {"train.py": VICTIM},
        ["python", "train.py"],
        env={"VICTIM_SECRET": secret},
        agents=["e2e-2"],
    )
    assert cluster.wait_for(done_id, TERMINAL)["state"] == "SUCCEEDED", cluster.logs_text(done_id)
    victim_id = submit_as(
        cluster,
        victim_token,
        {"train.py": VICTIM},
        ["python", "train.py"],
        env={"VICTIM_SECRET": secret, "VICTIM_SECONDS": "120"},
        agents=["e2e-1"],
    )
    wait_until(lambda: cluster.job(victim_id)["state"] == "RUNNING", 60, "the victim job running")
    wait_until(lambda: task_dirs_of(cluster.root, victim_id), 30, "the victim's task dir")
    victim_dir = task_dirs_of(cluster.root, victim_id)[0]
    victim_uid = victim_dir.stat().st_uid
    assert stat.S_IMODE(victim_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((victim_dir / "output").stat().st_mode) == 0o700

    attacker_dir = cluster.root / "e2e-2"
    cache = attacker_dir / "bundles"
    cached = {path: path.read_bytes() for path in cache.iterdir()}
    assert cached, "the attacker's agent has cached the victim's bundle"
    credential = (attacker_dir / "agent-credential").read_bytes()
    probe_id = submit_as(
        cluster,
        attacker_token,
        {"train.py": PROBE},
        ["python", "train.py"],
        agents=["e2e-2"],
        env={
            "PROBE_WORK_DIR": str(attacker_dir),
            "PROBE_AGENT_PID": str(cluster.agents["e2e-2"].popen.pid),
            "PROBE_DIGEST": next(iter(cached)).name,
            "PROBE_VICTIM_OUTPUT": str(victim_dir / "output" / "victim-output.txt"),
            "PROBE_SECRET_MARK": secret,
        },
    )
    job = cluster.wait_for(probe_id, TERMINAL)
    logs = cluster.logs_text(probe_id)
    assert job["state"] == "SUCCEEDED", logs
    line = next(x["text"] for x in cluster.logs(probe_id) if x["text"].startswith("PROBE "))
    found = json.loads(line.removeprefix("PROBE "))

    refused = [
        "read_credential",
        "walk_up_to_credential",
        "list_bundle_cache",
        "overwrite_cached_bundle",
        "read_agent_cmdline",
        "read_agent_environ",
        "signal_agent",
        "read_victim_output",
        "write_system",
        "become_root",
        "write_own_bundle",
    ]
    assert {name: found[name] for name in refused if found[name]["ok"]} == {}
    # Of the agent's work dir the task sees its own job only; no process shows a secret.
    listed = found["list_other_jobs"]
    assert not listed["ok"] or listed["value"] == repr([probe_id]), listed
    assert found["secrets_in_proc"] == []
    assert found["uid"] not in (0, os.geteuid()) or os.geteuid() != 0
    if os.geteuid() == 0:
        assert found["uid"] != 0 and found["pids"][:2] == [1, 2], found["pids"]  # its own PID namespace
        # A private /tmp: empty but for the way down to its own task dir and to the agent's Python and
        # mwms (bound back read-only when they live under /tmp, as in a CI clone).
        reachable = [attacker_dir, *(Path(p) for p in needed_paths())]
        allowed = {part for path in reachable for part in path.resolve().parts}
        assert set(found["tmp"]) <= allowed, found["tmp"]
    assert found["own_dirs_writable"] is True

    # Nothing changed: the cache, the credential, the victim job; the ended job left nothing behind.
    assert {path: path.read_bytes() for path in cached} == cached
    assert all(hashlib.sha256(data).hexdigest() == path.name for path, data in cached.items())
    assert (attacker_dir / "agent-credential").read_bytes() == credential
    assert cluster.job(victim_id)["state"] == "RUNNING"
    assert victim_dir.stat().st_uid == victim_uid
    wait_until(lambda: not task_dirs_of(cluster.root, done_id), 30, "the ended job's task dirs removed")
    with cluster.client(victim_token) as client:
        assert client.post(f"/api/v1/jobs/{victim_id}/cancel").status_code == 200
    cluster.wait_for(victim_id, TERMINAL)
