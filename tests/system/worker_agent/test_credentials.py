"""The agent's credential: kept 0600 in its work dir (itself 0700), presented on every call, never logged;
refusals end the agent with exit code 2; --ca-file makes a TLS channel that trusts only that CA; the join
token comes from MWMS_JOIN_TOKEN or --join-token-file, never from the command line."""

from __future__ import annotations

import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from mwms.cli.daemons import read_join_token
from mwms.cli.errors import CliError
from mwms.server.tls import ensure_self_signed
from mwms.worker_agent.config import AgentConfig
from mwms.worker_agent.credentials import CREDENTIAL_FILE, CredentialStore
from mwms.worker_agent.work_dir import prepare_work_dir
from mwms_testkit.agent_builders import connected

# What testkit/mwms_testkit/fake_coordinator.py's fake coordinator issues (fixtures only there, so it is repeated here).
FAKE_CREDENTIAL = "mwmsa_agent-1.fake-secret-for-tests"


def test_the_credential_from_register_is_kept_0600_and_presented_after_a_restart(
    coordinator, start_agent, wait_for, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    fake, address = coordinator
    agent = start_agent(address, join_token="s3cret")
    stream = connected(fake, wait_for)
    assert stream.agent_id == "agent-1"  # the fake checks the Connect call carries the credential
    path = tmp_path / "agent" / CREDENTIAL_FILE
    assert path.read_text().strip() == FAKE_CREDENTIAL
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    _, first_metadata = fake.registrations[0]
    assert "authorization" not in dict(first_metadata)  # nothing to present before the first join
    assert agent.shut_down() == 0

    again = start_agent(address)  # no join token: the credential is enough
    connected(fake, wait_for, count=2)
    _, metadata = fake.registrations[1]
    assert dict(metadata)["authorization"] == f"Bearer {FAKE_CREDENTIAL}"
    assert path.read_text().strip() == FAKE_CREDENTIAL
    assert again.shut_down() == 0
    secret = FAKE_CREDENTIAL.split(".", 1)[1]
    assert secret not in caplog.text
    assert secret not in repr(again.config) and secret not in repr(CredentialStore(path.parent))


@pytest.mark.parametrize("code", [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED])
def test_a_refused_credential_or_name_ends_the_agent_with_code_2(
    coordinator, start_agent, code: grpc.StatusCode, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.refuse_with = code
    agent = start_agent(address)
    agent.thread.join(10)
    assert agent.exit_code == 2 and fake.streams == []
    assert "the coordinator refused this agent" in caplog.text


def test_a_credential_file_readable_by_others_is_restricted(tmp_path: Path) -> None:
    path = tmp_path / CREDENTIAL_FILE
    path.write_text(FAKE_CREDENTIAL + "\n")
    path.chmod(0o644)
    store = CredentialStore(tmp_path)
    assert store.load() and store.get() == FAKE_CREDENTIAL
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not CredentialStore(tmp_path / "empty").load()


def test_ca_file_makes_a_tls_channel_that_trusts_that_ca_only(
    serve_coordinator, start_agent, wait_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    made = ensure_self_signed(tmp_path / "tls", ["127.0.0.1"])
    pair = (made.server.key.read_bytes(), made.server.cert.read_bytes())
    fake, address = serve_coordinator(tls=pair)

    stranger_ca = ensure_self_signed(tmp_path / "other-tls", ["127.0.0.1"]).ca_cert
    doubtful = start_agent(address, ca_file=stranger_ca, work_dir=tmp_path / "doubtful")
    plain = start_agent(address, work_dir=tmp_path / "plain")
    doubtful.thread.join(2)
    assert fake.registrations == []  # neither the wrong CA nor clear text gets through
    doubtful.shut_down()
    plain.shut_down()

    trusting = start_agent(address, ca_file=made.ca_cert, work_dir=tmp_path / "trusting")
    assert connected(fake, wait_for).agent_id == "agent-1"
    assert trusting.shut_down() == 0
    assert "tls=True" in repr(AgentConfig(server=address, name="n", work_dir=tmp_path, ca_file=made.ca_cert))


def test_the_work_dir_is_made_0700_and_one_open_to_others_is_restricted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    fresh = tmp_path / "a" / "work"
    prepare_work_dir(fresh)
    assert mode(fresh) == 0o700 and caplog.records == []
    prepare_work_dir(fresh, traversable=True)  # others may pass through to their task dirs, not list it
    assert mode(fresh) == 0o711 and caplog.records == []
    prepare_work_dir(fresh)
    assert mode(fresh) == 0o700 and caplog.records == []

    fresh.chmod(0o755)
    prepare_work_dir(fresh)
    assert mode(fresh) == 0o700
    assert "can be listed or written by other users" in caplog.text and "0755" in caplog.text


SECRET = "join-secret-for-the-cli-tests"


def agent_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mwms agent` against a port nothing listens on, without any MWMS_* variable of ours."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    command = [sys.executable, "-m", "mwms.cli.main", "agent", "--server", "127.0.0.1:9", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env={**clean, **(env or {})})


def test_a_join_token_on_the_command_line_is_refused_without_being_echoed(tmp_path: Path) -> None:
    work_dir = tmp_path / "work"
    for flag in (["--join-token", SECRET], [f"--join-token={SECRET}"]):
        result = agent_command(*flag, "--work-dir", str(work_dir))
        assert result.returncode == 2, result.stderr
        assert "MWMS_JOIN_TOKEN" in result.stderr and "--join-token-file" in result.stderr
        assert SECRET not in result.stdout + result.stderr
    assert not work_dir.exists()  # refused before the agent did anything
    shown = agent_command("--help").stdout
    assert "--join-token-file" in shown and not re.search(r"--join-token(?!-file)", shown)


@pytest.mark.parametrize(
    ("content", "mode", "expected"),
    [
        (SECRET, 0o640, "can be read by other users"),
        (SECRET, 0o604, "chmod 600"),
        ("  \n", 0o600, "is empty"),
        (None, 0o600, "cannot read --join-token-file"),
    ],
)
def test_a_join_token_file_must_hold_a_token_only_its_owner_can_read(
    tmp_path: Path, content: str | None, mode: int, expected: str
) -> None:
    token_file = tmp_path / "join-token"
    if content is not None:
        token_file.write_text(content)
        token_file.chmod(mode)
    result = agent_command("--join-token-file", str(token_file), "--work-dir", str(tmp_path / "work"))
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_the_join_token_is_read_once_and_taken_out_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MWMS_JOIN_TOKEN", f" {SECRET}\n")
    assert read_join_token(None) == SECRET
    assert "MWMS_JOIN_TOKEN" not in os.environ  # nothing the agent starts inherits it
    assert read_join_token(None) == ""

    token_file = tmp_path / "join-token"
    token_file.write_text(f"{SECRET}\n")
    token_file.chmod(0o600)
    assert read_join_token(token_file) == SECRET
    monkeypatch.setenv("MWMS_JOIN_TOKEN", SECRET)
    with pytest.raises(CliError, match="not both"):
        read_join_token(token_file)
