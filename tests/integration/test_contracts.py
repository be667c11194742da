"""Contracts that the coordinator and the agent share, each with one home in mwms/: the gRPC link
(mwms/agent_link.py), loopback hosts (mwms/loopback.py), the agent's defaults (mwms/agent_defaults.py)
and the length of a name (mwms/metrics_line.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mwms import agent_defaults, agent_link, metrics_line
from mwms.cli.main import app
from mwms.loopback import host_of, is_loopback, is_loopback_address
from mwms.server import limits
from mwms.server.settings import Settings
from mwms.worker_agent.channel import CHANNEL_OPTIONS, ChannelFactory
from mwms.worker_agent.config import AgentConfig
from mwms_testkit import simulator

# --- the gRPC link ---


def test_the_agents_pings_pass_the_coordinators_policy() -> None:
    assert agent_link.client_pings_allowed(CHANNEL_OPTIONS, agent_link.server_keepalive_options())
    assert agent_link.CLIENT_PING_INTERVAL_MS >= agent_link.SERVER_MIN_PING_INTERVAL_MS
    # A lost link is noticed within a ping interval and its timeout (about 15 s).
    assert agent_link.CLIENT_PING_INTERVAL_MS + agent_link.CLIENT_PING_TIMEOUT_MS <= 15_000


@pytest.mark.parametrize(
    ("client", "server", "allowed"),
    [
        (
            [("grpc.keepalive_time_ms", 4_999)],
            [("grpc.http2.min_ping_interval_without_data_ms", 5_000)],
            False,
        ),
        (
            [("grpc.keepalive_time_ms", 5_000)],
            [("grpc.http2.min_ping_interval_without_data_ms", 5_000)],
            True,
        ),
        ([("grpc.keepalive_time_ms", 10_000)], [], False),  # gRPC's server default: one ping per 5 min
        ([("grpc.keepalive_time_ms", 300_000)], [], True),
        ([], [("grpc.http2.min_ping_interval_without_data_ms", 5_000)], True),  # never pings
        (
            [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_permit_without_calls", 1)],
            [("grpc.http2.min_ping_interval_without_data_ms", 5_000)],
            False,  # pings with no call open, which the server does not permit
        ),
    ],
)
def test_the_ping_policy_check_on_edge_values(client: Any, server: Any, allowed: bool) -> None:
    assert agent_link.client_pings_allowed(client, server) is allowed


def test_both_sides_and_the_simulated_agents_use_the_one_flow_control() -> None:
    # No bandwidth-delay probe pings on either side, and the same fixed stream window (mwms/agent_link.py).
    wanted = dict(agent_link.flow_control_options())
    assert wanted == {"grpc.http2.bdp_probe": 0, "grpc.http2.lookahead_bytes": agent_link.STREAM_WINDOW_BYTES}
    for side in (CHANNEL_OPTIONS, agent_link.server_keepalive_options(), simulator.CHANNEL_OPTIONS):
        assert {name: dict(side).get(name) for name in wanted} == wanted


def test_both_sides_use_the_one_receive_limit() -> None:
    assert dict(CHANNEL_OPTIONS)["grpc.max_receive_message_length"] == agent_link.AGENT_RECEIVE_LIMIT_BYTES
    assert limits.AGENT_RECEIVE_LIMIT_BYTES is agent_link.AGENT_RECEIVE_LIMIT_BYTES
    # The coordinator refuses a start command the agents could not receive (services/job_life/start_commands.py).
    from mwms.server.services.job_life import start_commands

    assert start_commands.AGENT_RECEIVE_LIMIT_BYTES is agent_link.AGENT_RECEIVE_LIMIT_BYTES
    assert start_commands.oversize_reason(agent_link.AGENT_RECEIVE_LIMIT_BYTES) is None
    assert start_commands.oversize_reason(agent_link.AGENT_RECEIVE_LIMIT_BYTES + 1) is not None


def test_the_channel_options_are_the_contracts() -> None:
    options = dict(CHANNEL_OPTIONS)
    for name, value in agent_link.channel_options():
        assert options[name] == value


# --- loopback ---


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("LocalHost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("", False),
        ("::", False),
        ("10.0.0.1", False),
        ("127.example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_one_loopback_rule_for_both_sides(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    from mwms.server import settings

    assert settings.is_loopback(host) is loopback  # the coordinator's hosts
    port = f"[{host.strip('[]')}]:50051" if ":" in host else f"{host}:50051"
    assert is_loopback_address(port) is loopback  # the agent's "host:port"


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("127.0.0.1:50051", "127.0.0.1"),
        ("[::1]:50051", "::1"),
        ("::1", "::1"),
        ("coord", "coord"),
        ("c:1", "c"),
    ],
)
def test_host_of_an_address(address: str, host: str) -> None:
    assert host_of(address) == host


def test_the_coordinator_answers_loopback_hosts_only_when_bound_to_loopback() -> None:
    assert "*" not in Settings(http_host="::1").trusted_hosts
    assert Settings(http_host="0.0.0.0").trusted_hosts == ["*"]


def test_the_agent_warns_of_clear_text_off_loopback_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mwms.worker_agent.credentials import CredentialStore

    store = CredentialStore(tmp_path)
    with caplog.at_level(logging.WARNING, logger="mwms.agent.channel"):
        ChannelFactory(AgentConfig(server="[::1]:50051", name="a", work_dir=tmp_path), store)
        assert not caplog.records
        ChannelFactory(AgentConfig(server="10.0.0.1:50051", name="a", work_dir=tmp_path), store)
    assert "clear text" in caplog.text


# --- the agent's defaults ---


def test_agent_config_holds_the_defaults(tmp_path: Path) -> None:
    config = AgentConfig(server=agent_defaults.SERVER, name="a", work_dir=tmp_path)
    assert config.slots == agent_defaults.SLOTS
    assert (config.port_low, config.port_high) == (agent_defaults.PORT_LOW, agent_defaults.PORT_HIGH)
    assert config.stop_grace == agent_defaults.STOP_GRACE_S
    assert config.device_sample_interval == agent_defaults.DEVICE_SAMPLE_INTERVAL_S
    assert config.sandbox == agent_defaults.SANDBOX
    assert config.task_uids == (agent_defaults.TASK_UID_LOW, agent_defaults.TASK_UID_HIGH)


@pytest.fixture
def started_config(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs `mwms agent ARGS` up to run_agent and returns the AgentConfig it was given."""
    import signal

    from mwms.worker_agent import main

    seen: list[AgentConfig] = []
    monkeypatch.setattr(main, "run_agent", lambda config, stop: seen.append(config) or 0)
    monkeypatch.delenv("MWMS_JOIN_TOKEN", raising=False)
    for variable in ("MWMS_AGENT_SANDBOX", "MWMS_AGENT_TASK_UIDS", "MWMS_AGENT_TASK_USER", "MWMS_CA_FILE"):
        monkeypatch.delenv(variable, raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def start(*args: str) -> AgentConfig:
        try:
            result = CliRunner().invoke(app, ["agent", *args])
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        assert result.exit_code == 0, result.output
        return seen[-1]

    return start


def test_an_agent_started_without_options_gets_the_configs_defaults(started_config: Any) -> None:
    config = started_config("--name", "n")
    defaults = AgentConfig(
        server=agent_defaults.SERVER, name="n", work_dir=Path(agent_defaults.WORK_DIR).expanduser()
    )
    assert config.server == agent_defaults.SERVER
    assert config.work_dir == defaults.work_dir
    for field in (
        "slots",
        "port_low",
        "port_high",
        "device_sample_interval",
        "sandbox",
        "task_uids",
        "stop_grace",
    ):
        assert getattr(config, field) == getattr(defaults, field), field


def test_options_given_override_the_defaults(started_config: Any, tmp_path: Path) -> None:
    config = started_config(
        "--name", "n", "--work-dir", str(tmp_path), "--slots", "3", "--port-range", "30000-30009",
        "--device-sample-interval", "0", "--sandbox", "BWRAP", "--task-uids", "61000-61009",
    )  # fmt: skip
    assert (config.work_dir, config.slots, config.port_low, config.port_high) == (tmp_path, 3, 30000, 30009)
    assert (config.device_sample_interval, config.sandbox, config.task_uids) == (0, "bwrap", (61000, 61009))


def test_help_shows_the_agents_defaults() -> None:
    result = CliRunner().invoke(app, ["agent", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for shown in (
        agent_defaults.SERVER,
        agent_defaults.WORK_DIR,
        f"[default: {agent_defaults.SLOTS}]",
        agent_defaults.port_range(),
        agent_defaults.task_uid_range(),
        f"[default: {agent_defaults.SANDBOX}]",
        f"[default: {agent_defaults.DEVICE_SAMPLE_INTERVAL_S:g}s]",
    ):
        assert shown in text, shown


# --- the length of a name ---


def test_one_name_length_for_metrics_jobs_and_agents() -> None:
    from pydantic import ValidationError

    from mwms.server.schemas import JobCreate

    assert limits.MAX_NAME_CHARS == metrics_line.MAX_NAME_LENGTH == 200
    longest = "n" * metrics_line.MAX_NAME_LENGTH
    assert metrics_line.name_problem(longest) is None
    assert metrics_line.name_problem(longest + "n") is not None
    spec = {"bundle_digest": "0" * 64, "command": ["python"], "workers": 1}
    assert JobCreate(name=longest, **spec).name == longest
    with pytest.raises(ValidationError):
        JobCreate(name=longest + "n", **spec)


def test_the_cli_and_the_sandbox_know_the_same_modes() -> None:
    from mwms.worker_agent import sandbox

    assert sandbox.SANDBOX_MODES == agent_defaults.SANDBOX_MODES
    assert agent_defaults.SANDBOX in agent_defaults.SANDBOX_MODES
