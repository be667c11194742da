"""A hostile task against the kernel's wider surfaces, on a root agent with bubblewrap (as in CI): no new
user namespace (root inside one), no keyring to leave a key in for the uid's next holder, no io_uring, no
mount; while threads, processes and shared memory work as training needs them."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the seccomp filter needs a bubblewrap sandbox (CI runs as root)"
    ),
]

PROBE = r"""
import ctypes, errno, json, multiprocessing, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
NUMBERS = {"x86_64": {"add_key": 248, "keyctl": 250, "io_uring_setup": 425}, "aarch64": {"add_key": 217, "keyctl": 219, "io_uring_setup": 425}}[os.uname().machine]
def call(name, *args):
    result = libc.syscall(NUMBERS[name], *args)
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
results = {
    "add_key": call("add_key", b"user", b"mwms-probe", b"secret", 6, ctypes.c_int(-4)),
    "keyctl_get_keyring": call("keyctl", 0, ctypes.c_int(-4), 0),
    "io_uring_setup": call("io_uring_setup", 8, ctypes.create_string_buffer(120)),
    "unshare_user": subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode,
    "mount": libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0,
}
CLONE_NEWUSER = 0x10000000
results["libc_unshare"] = "ok" if libc.unshare(CLONE_NEWUSER) == 0 else errno.errorcode[ctypes.get_errno()]
with multiprocessing.Pool(2) as pool:
    results["pool"] = pool.map(abs, [-1, -2])
done = []
worker = threading.Thread(target=lambda: done.append(1))
worker.start(); worker.join()
results["thread"] = done
print("PROBE " + json.dumps(results), flush=True)
"""


def test_a_task_gets_no_user_namespace_keyring_io_uring_or_mount(cluster) -> None:
    job_id = cluster.submit({"probe.py": PROBE}, ["python", "probe.py"], workers=1)
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", cluster.logs_text(job_id)
    line = next(x for x in cluster.logs_text(job_id).splitlines() if "PROBE {" in x)
    seen = json.loads(line.split("PROBE ", 1)[1])
    assert seen["add_key"] == "EPERM" and seen["keyctl_get_keyring"] == "EPERM", seen
    assert seen["io_uring_setup"] == "EPERM", seen
    assert seen["unshare_user"] != 0 and seen["libc_unshare"] == "EPERM", seen
    assert seen["mount"] is False, seen
    assert seen["pool"] == [1, 2] and seen["thread"] == [1], seen
