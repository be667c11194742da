"""`Job.wait()` and `Job.logs(follow=True)` outlive a coordinator restart: a coordinator and an agent of this
test's own, a job that runs while the coordinator is stopped and started again on the same ports."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms import Client
from mwms_testkit.cluster import Cluster, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    instance = Cluster(root=tmp_path / "cluster")
    instance.root.mkdir()
    try:
        instance.start_server()
        instance.start_agent("restart-1", 23000)
        yield instance
    finally:
        instance.stop()


def test_wait_and_follow_survive_a_coordinator_restart(
    own_cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The task (sandboxed: it cannot see this test's files) ends once this port, bound now, listens.
    go = socket.socket()
    go.bind(("127.0.0.1", 0))
    program = tmp_path / "p"
    program.mkdir()
    (program / "main.py").write_text(
        "import socket, time\n"
        "print('waiting for the restart', flush=True)\n"
        "deadline = time.monotonic() + 60\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        f"        socket.create_connection(('127.0.0.1', {go.getsockname()[1]}), timeout=1).close()\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "print('done', flush=True)\n"
    )
    caplog.set_level(logging.INFO, logger="mwms.client")
    with Client(own_cluster.api, token=own_cluster.admin_token) as client:
        job = client.submit(program, "python main.py", workers=1, restart={"max_restarts": 0})
        states: list[str] = []
        outcome: dict[str, object] = {}

        def wait() -> None:
            try:
                outcome["state"] = job.wait(timeout=120, on_progress=lambda j: states.append(j.state))
            except Exception as error:  # reported by the assertion below
                outcome["error"] = error

        followed: list[str] = []

        def follow() -> None:
            try:
                followed.extend(line.text for line in job.logs(follow=True))
            except Exception as error:  # reported by the assertion below
                followed.append(f"error: {error!r}")

        waiter, follower = threading.Thread(target=wait), threading.Thread(target=follow)
        waiter.start()
        follower.start()
        wait_until(lambda: "RUNNING" in states, 60, "the job to run", interval=0.1)
        before = len(states)
        # Stop (SIGTERM; SIGKILL after 10 s: the coordinator waits for the open log follow), then start on
        # the same ports until /healthz answers.
        own_cluster.restart_server()
        assert waiter.is_alive(), outcome
        go.listen()
        waiter.join(90)
        follower.join(30)
        go.close()
    assert not waiter.is_alive() and not follower.is_alive()
    assert followed == ["waiting for the restart", "done"]
    assert outcome == {"state": "SUCCEEDED"}, (
        outcome,
        own_cluster.server.log_tail() if own_cluster.server else "",
    )
    assert len(states) > before and states[-1] == "SUCCEEDED"
    messages = [record.getMessage() for record in caplog.records]
    # Each retrying request says once, as its retries begin, what it is waiting for (transport.py).
    assert any(message.startswith("cannot get an answer from ") for message in messages), messages
    retries = [
        message for message in messages if message.startswith(("GET ", "POST ")) and "retry" in message
    ]
    assert retries, "the client should have waited out the restart"
    assert all(message.startswith("GET /api/v1/jobs/") for message in retries), retries
