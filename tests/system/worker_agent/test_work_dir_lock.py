"""One agent per work dir: a second `mwms agent` on it refuses to start and names the first (the kernel
frees the lock however the first one ends); a saved credential the coordinator refuses is set aside and
the join token, when one is given, admits the agent again."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mwms.worker_agent.credentials import CREDENTIAL_FILE
from mwms.worker_agent.work_dir import LOCK_FILE
from mwms_testkit.agent_builders import connected

JOIN_TOKEN = "work-dir-lock-test-join-token-0123456789"
NOWHERE = "127.0.0.1:9"  # nothing listens: the agent keeps retrying, holding its work dir


def start_agent_process(work_dir: Path, name: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "mwms.cli.main", "agent", "--server", NOWHERE, "--name", name]
    argv += ["--work-dir", str(work_dir), "--slots", "1"]
    env = {**os.environ, "MWMS_JOIN_TOKEN": JOIN_TOKEN}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_lock_note(work_dir: Path, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        note = work_dir / LOCK_FILE
        if note.exists() and name in note.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"agent {name} did not take {work_dir}")


def test_a_second_agent_on_one_work_dir_refuses_and_names_the_first(tmp_path: Path) -> None:
    work_dir = tmp_path / "agent"
    first = start_agent_process(work_dir, "first")
    try:
        wait_for_lock_note(work_dir, "first")
        second = start_agent_process(work_dir, "second")
        output, _ = second.communicate(timeout=60)
        assert second.returncode == 2, output
        holder = f"agent 'first' (pid {first.pid} on {socket.gethostname()})"
        assert f"the work dir {work_dir} is in use by {holder}" in output
        assert "give this agent a --work-dir of its own" in output
        assert first.poll() is None  # the first one was left alone
    finally:
        first.send_signal(signal.SIGKILL)  # no clean exit: the kernel frees the lock all the same
        first.wait(30)
    third = start_agent_process(work_dir, "third")
    try:
        wait_for_lock_note(work_dir, "third")
        assert third.poll() is None
    finally:
        third.terminate()
        third.wait(30)


def test_a_refused_saved_credential_falls_back_to_the_join_token(
    coordinator, start_agent, wait_for, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    fake, address = coordinator
    agent = start_agent(address, join_token="s3cret")
    connected(fake, wait_for)
    assert agent.shut_down() == 0
    fake.refuse_credentials = True  # as a coordinator does for an agent an admin removed

    again = start_agent(address, join_token="s3cret")
    connected(fake, wait_for, count=2)
    presented = ["authorization" in dict(metadata) for _, metadata in fake.registrations]
    assert presented == [False, True, False]  # joined, refused with the credential, joined again
    assert "the coordinator refused the saved credential" in caplog.text
    assert (tmp_path / "agent" / f"{CREDENTIAL_FILE}.refused").exists()
    assert (tmp_path / "agent" / CREDENTIAL_FILE).exists()  # the new one
    assert again.shut_down() == 0


def test_without_a_join_token_a_refused_credential_still_ends_the_agent(
    coordinator, start_agent, wait_for, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    agent = start_agent(address, join_token="s3cret")
    connected(fake, wait_for)
    assert agent.shut_down() == 0
    fake.refuse_credentials = True
    again = start_agent(address)
    again.thread.join(10)
    assert again.exit_code == 2
    assert "the coordinator refused this agent" in caplog.text
