"""Several coordinator replicas for one agent: what `--server a:50051,b:50051` may hold, the order the agent
moves through the replicas (worker_agent/channel.py ServerRotation), and the agent doing so against real
gRPC servers (fake coordinators) that are stopped under it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import grpc
import pytest
from typer.testing import CliRunner

from mwms import agent_defaults
from mwms.cli.main import app
from mwms.loop import Backoff
from mwms.worker_agent import main
from mwms.worker_agent.channel import CHANNEL_OPTIONS, ServerRotation
from mwms.worker_agent.config import AgentConfig, parse_servers
from mwms_testkit.cluster import free_port

# --- parsing ---


@pytest.mark.parametrize(
    ("text", "addresses"),
    [
        ("127.0.0.1:50051", ("127.0.0.1:50051",)),
        ("a:1,b:2,c:3", ("a:1", "b:2", "c:3")),
        (" a:1 , b:2 ", ("a:1", "b:2")),
        ("[::1]:50051,[fd00::5]:7", ("[::1]:50051", "[fd00::5]:7")),
        ("coord-a.example.com.:443", ("coord-a.example.com.:443",)),
        ("coord_a.internal:65535", ("coord_a.internal:65535",)),
    ],
)
def test_addresses_that_parse(text: str, addresses: tuple[str, ...]) -> None:
    assert parse_servers(text) == addresses


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", ["no coordinator address given", "HOST:PORT"]),
        ("a:1,", ["address 2 of 'a:1,' is empty", "single commas"]),
        ("a:1,,b:2", ["address 2 of 'a:1,,b:2' is empty"]),
        ("a:1,coord", ["'coord' has no port", "coord:50051"]),
        ("::1", ["'::1'", "brackets", "[::1]:50051"]),
        ("fd00::5:50051", ["brackets", "[fd00::5]:50051"]),
        ("[::1]", ["'[::1]' is not [IPV6]:PORT", "[::1]:50051"]),
        ("[nope]:1", ["'nope' is not an IPv6 address"]),
        ("a:1,http://b:2", ["'http://b:2'", "without a scheme"]),
        ("dns:///b:2", ["'dns:///b:2'", "without a scheme"]),
        ("a:0", ["'a:0'", "port '0'", "1 to 65535"]),
        ("a:65536", ["port '65536'"]),
        ("a:http", ["port 'http'"]),
        ("a:", ["port ''"]),
        ("a b:1", ["'a b' is not a host name"]),
        ("-a:1", ["'-a' is not a host name"]),
        ("a..b:1", ["'a..b' is not a host name"]),
        ("a:1,b:2,a:1", ["'a:1' is listed twice"]),
    ],
)
def test_a_bad_entry_is_named_with_what_to_write(text: str, said: list[str]) -> None:
    with pytest.raises(ValueError) as raised:
        parse_servers(text)
    for words in said:
        assert words in str(raised.value)


def test_at_most_max_servers_addresses() -> None:
    many = [f"coord-{n}:50051" for n in range(agent_defaults.MAX_SERVERS + 1)]
    assert len(parse_servers(",".join(many[:-1]))) == agent_defaults.MAX_SERVERS
    with pytest.raises(
        ValueError, match=f"33 coordinator addresses given, at most {agent_defaults.MAX_SERVERS}"
    ):
        parse_servers(",".join(many))


def test_the_config_holds_the_parsed_list_and_refuses_a_bad_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = AgentConfig(server="a:1, b:2", name="n", work_dir=tmp_path)
    assert config.servers == ("a:1", "b:2")
    assert "servers=" not in repr(config)
    with pytest.raises(ValueError, match="has no port"):
        AgentConfig(server="a", name="n", work_dir=tmp_path)


def test_the_cli_refuses_a_bad_list_before_starting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    command = [
        sys.executable,
        "-m",
        "mwms.cli.main",
        "agent",
        "--server",
        "a:50051,b",
        "--work-dir",
        str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=clean)
    assert result.returncode != 0
    assert "--server: 'b' has no port: write HOST:PORT, e.g. b:50051" in result.stderr + result.stdout
    assert not (tmp_path / "agent-credential").exists()


def test_the_cli_passes_the_list_on_and_advertises_towards_the_first(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import signal

    seen: list[AgentConfig] = []
    monkeypatch.setattr(main, "run_agent", lambda config, stop: seen.append(config) or 0)
    monkeypatch.delenv("MWMS_JOIN_TOKEN", raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = CliRunner().invoke(
            app, ["agent", "--name", "n", "--work-dir", str(tmp_path), "--server", "127.0.0.1:1, 10.9.9.9:2"]
        )
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert result.exit_code == 0, result.output
    assert seen[-1].servers == ("127.0.0.1:1", "10.9.9.9:2")
    assert seen[-1].advertise_address == "127.0.0.1"


# --- rotation and backoff ---


def test_the_rotation_starts_at_the_first_and_goes_round() -> None:
    servers = ServerRotation(("a:1", "b:2", "c:3"))
    assert (servers.current, servers.describe()) == ("a:1", "a:1 (1 of 3)")
    assert [servers.advance() for _ in range(4)] == ["b:2", "c:3", "a:1", "b:2"]
    assert servers.describe() == "b:2 (2 of 3)"
    single = ServerRotation(("a:1",))
    assert (single.advance(), single.describe()) == ("a:1", "a:1")


def test_reconnect_delays_are_short_capped_and_spread() -> None:
    backoff = Backoff(initial=main.RECONNECT_INITIAL_SECONDS, maximum=main.RECONNECT_MAXIMUM_SECONDS)
    first = []
    for _ in range(1000):
        backoff.reset()
        first.append(backoff.next_delay())
    assert 0.25 <= min(first) and max(first) <= 0.75  # the first retry after a healthy stream: 0.5 s +-50 %
    assert max(first) - min(first) > 0.4  # 1,000 agents do not retry in step
    later = [backoff.next_delay() for _ in range(1000)]
    assert max(later) <= main.RECONNECT_MAXIMUM_SECONDS * 1.5
    # The channel's own reconnect backoff never outlasts the agent's.
    assert dict(CHANNEL_OPTIONS)["grpc.max_reconnect_backoff_ms"] <= main.RECONNECT_MAXIMUM_SECONDS * 1000


# --- the agent against real gRPC servers ---


def registered_with(fake) -> int:  # type: ignore[no-untyped-def]
    return len(fake.registrations)


def test_the_agent_moves_round_the_replicas_as_each_stops(
    serve_coordinator, start_agent, wait_for, caplog
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="mwms.agent")
    replicas = [serve_coordinator() for _ in range(3)]
    (a, address_a), (b, address_b), (c, address_c) = replicas
    agent = start_agent(f"{address_a},{address_b},{address_c}")
    wait_for(lambda: a.streams and a.streams[0].of_kind("hello"), "a Hello on the first replica")
    # The agent logs "connected" once its Hello is sent: the replica may read it a moment before that line.
    wait_for(lambda: f"connected to coordinator {address_a} (1 of 3)" in caplog.text, "the connected line")

    a.server.stop(grace=None)
    wait_for(lambda: b.streams and b.streams[0].of_kind("hello"), "a Hello on the second replica")
    assert c.registrations == []
    assert (
        f"moving from coordinator {address_a} (1 of 3) to {address_b} (2 of 3): the stream broke"
        in caplog.text
    )
    wait_for(lambda: f"connected to coordinator {address_b} (2 of 3)" in caplog.text, "the connected line")

    # A replica that works is kept: the agent stays on it.
    wait_for(lambda: len(b.streams[0].of_kind("heartbeat")) >= 5, "heartbeats on the second replica")
    assert (registered_with(b), len(b.streams), c.registrations) == (1, 1, [])

    b.server.stop(grace=None)
    wait_for(lambda: c.streams and c.streams[0].of_kind("hello"), "a Hello on the third replica")
    assert agent.thread.is_alive()
    assert agent.shut_down() == 0


def test_a_replica_that_does_not_answer_is_skipped_at_start(
    serve_coordinator, start_agent, wait_for, caplog
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="mwms.agent")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    fake, address = serve_coordinator()
    start_agent(f"{dead},{address}")
    wait_for(lambda: fake.streams and fake.streams[0].of_kind("hello"), "a Hello on the second replica")
    assert f"cannot register with {dead} (1 of 2) yet: UNAVAILABLE" in caplog.text
    assert f"moving from coordinator {dead} (1 of 2) to {address} (2 of 2): registering failed" in caplog.text


def test_a_refusal_ends_the_agent_without_trying_the_other_replicas(serve_coordinator, start_agent) -> None:  # type: ignore[no-untyped-def]
    refusing, address_a = serve_coordinator()
    other, address_b = serve_coordinator()
    refusing.refuse_with = grpc.StatusCode.UNAUTHENTICATED
    agent = start_agent(f"{address_a},{address_b}")
    agent.thread.join(10)
    assert agent.exit_code == main.EXIT_REFUSED
    assert (len(refusing.registrations), other.registrations) == (1, [])


def test_a_replica_gone_silent_is_left_for_the_next(
    serve_coordinator, start_agent, wait_for, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    from test_link_loss import FreezingProxy

    from mwms.worker_agent import connection

    caplog.set_level(logging.INFO, logger="mwms.agent")
    monkeypatch.setattr(connection, "SILENCE_GRACE_SECONDS", 0.5)  # limit: 3 x 0.2 s + 0.5 s
    silent, address_a = serve_coordinator()
    other, address_b = serve_coordinator()
    silent.answer_heartbeats = True
    proxy = FreezingProxy(address_a)
    try:
        start_agent(f"{proxy.address},{address_b}")
        wait_for(
            lambda: silent.streams and silent.streams[0].of_kind("hello"), "a Hello on the first replica"
        )
        wait_for(lambda: len(silent.streams[0].of_kind("heartbeat")) >= 3, "answered heartbeats")
        proxy.freeze()  # the network to it drops everything, without closing a connection
        wait_for(lambda: other.streams and other.streams[0].of_kind("hello"), "a Hello on the second replica")
        assert "the stream went silent" in caplog.text
    finally:
        proxy.close()
