"""A hostile job's tasks against another job's TensorFlow servers, ports and the coordinator, on two root
agents (as in CI): every connect and bind outside its own is refused, the outside world stays reachable,
and the victim's real 2-worker MultiWorkerMirroredStrategy job succeeds in one attempt."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator

import pytest

from mwms_testkit.cluster import Cluster
from mwms_testkit.parallel import task_ports

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.tf,
    pytest.mark.skipif(os.geteuid() != 0, reason="port rules need a root agent (CI runs as root)"),
]

# The two agents' task port ranges, as this pytest-xdist worker shifts them (mwms_testkit/parallel.py).
RANGES = tuple((task_ports(low), task_ports(low) + 99) for low in (23100, 23200))

ATTACKER = r"""
import errno, json, os, socket, time
own = int(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0].rsplit(":", 1)[1])
ports = [p for low, high in json.loads(os.environ["RANGES"]) for p in range(low, high + 1)]
held, connected, refusals = [], set(), {}
def note(error):
    name = errno.errorcode.get(error.errno, str(error.errno))
    refusals[name] = refusals.get(name, 0) + 1
own_socket = socket.socket()
own_socket.bind(("0.0.0.0", own))
own_socket.listen()
print("ATTACKER ready", flush=True)
deadline = time.time() + float(os.environ["SECONDS"])
while time.time() < deadline:
    for port in ports:
        if port == own:
            continue
        squat = socket.socket()
        try:
            squat.bind(("0.0.0.0", port))
            squat.listen()
            held.append(squat)
        except OSError as error:
            note(error)
            squat.close()
        probe = socket.socket()
        probe.settimeout(0.2)
        try:
            probe.connect(("127.0.0.1", port))
            connected.add(port)
        except OSError as error:
            note(error)
        finally:
            probe.close()
    time.sleep(0.5)
def reach(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "connected"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
def reach_abstract(name):
    try:
        probe = socket.socket(socket.AF_UNIX)
        probe.connect("\0" + name)
        return "connected"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
print("ATTACKER " + json.dumps({
    "host_abstract_socket": reach_abstract(os.environ["ABSTRACT_NAME"]),
    "held": [s.getsockname()[1] for s in held],
    "connected": sorted(connected),
    "refusals": refusals,
    "coordinator_grpc": reach(int(os.environ["GRPC_PORT"])),
    "outside": reach(int(os.environ["OUTSIDE_PORT"])),
}), flush=True)
"""

VICTIM = """
import time
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
for step in range(8):
    value = strategy.run(lambda: tf.constant(1.0))
    total = float(strategy.reduce("SUM", value, axis=None))
    time.sleep(1)
print("VICTIM done", total, flush=True)
"""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    instance = Cluster(root=tmp_path_factory.mktemp("guarded"))
    try:
        instance.start_server()
        for index, (low, _) in enumerate(RANGES):
            instance.start_agent(f"guarded-{index}", low, slots=2)
        yield instance
    finally:
        instance.stop()


def test_a_hostile_job_reaches_and_binds_no_other_jobs_ports(guarded: Cluster) -> None:
    outside = socket.socket()
    outside.bind(("127.0.0.1", 0))
    outside.listen(8)
    abstract_name = f"mwms-e2e-host-{os.getpid()}"
    host_daemon = socket.socket(socket.AF_UNIX)
    host_daemon.bind("\0" + abstract_name)
    host_daemon.listen(8)
    env = {
        "RANGES": json.dumps(RANGES),
        "SECONDS": "25",
        "GRPC_PORT": str(guarded.grpc_port),
        "OUTSIDE_PORT": str(outside.getsockname()[1]),
        "ABSTRACT_NAME": abstract_name,
    }
    attacker = guarded.submit({"attack.py": ATTACKER}, ["python", "attack.py"], workers=1, env=env)
    guarded.wait_for(attacker, {"RUNNING"}, timeout=60)
    victim = guarded.submit({"train.py": VICTIM}, ["python", "train.py"], workers=2, name="victim")
    job = guarded.wait_for(victim, {"SUCCEEDED", "FAILED"}, timeout=240)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + guarded.logs_text(victim)
    assert len(job["attempt_history"]) == 1, job["attempt_history"]
    assert "VICTIM done 2.0" in guarded.logs_text(victim)

    done = guarded.wait_for(attacker, {"SUCCEEDED", "FAILED"}, timeout=90)
    assert done["state"] == "SUCCEEDED", guarded.logs_text(attacker)
    line = next(x for x in guarded.logs_text(attacker).splitlines() if "ATTACKER {" in x)
    seen = json.loads(line.split("ATTACKER ", 1)[1])
    assert seen["held"] == [], seen  # no port of either agent's range but its own
    assert seen["connected"] == [], seen  # not the victim's gRPC servers, on this agent or the other
    assert seen["refusals"].get("EPERM", 0) > 0, seen
    assert seen["coordinator_grpc"] == "EPERM", seen
    assert seen["outside"] == "connected", seen
    assert seen["host_abstract_socket"] == "EPERM", seen  # a host daemon's abstract unix socket
    outside.close()
    host_daemon.close()
