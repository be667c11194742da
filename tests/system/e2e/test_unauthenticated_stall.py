"""Floods and slow clients against a real coordinator, none of which needs a token (one needs a user's): a
128 MB request header, a body of 800,000 multipart parts, a 128 MB gRPC metadata value, slowloris and
idle connections (issue 16). Each is refused or closed within its bound, and meanwhile /healthz and a
simulated agent's heartbeats keep answering fast (p99 under P99_BOUND_S; see there for the figures).

Before the bounds, on the 2-core test machine, a 64 MB header held /healthz for 4 s and heartbeats for
3.9 s; 128 MB for 11.7 s and 15.9 s; 800,000 parts held heartbeats for 1.9 s per upload.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mwms_testkit.bombs import grpc_call_head, http2_frame, many_parts_body
from mwms_testkit.cluster import Cluster, wait_until
from mwms_testkit.simulator import SimAgent, SimConfig  # noqa: E402

# Bounds latencies: under pytest-xdist it runs while no other test does (tests/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.alone]

MiB = 1024 * 1024
# Shorter than the defaults (10 s, 5 s, 30 s) to keep the module fast; the code paths are the same.
HEAD_TIMEOUT_S = 4.0
KEEP_ALIVE_S = 2
BODY_IDLE_S = 3.0
FLOOD_S = 4.0  # each flood is sent again and again for this long
POLL_S = 0.05
# The bar is 100 ms. Measured on the 2-core test machine during the floods (p99 of about 70
# samples, so the slowest): /healthz 8-73 ms and heartbeats 3-65 ms; with two CPU-bound processes beside
# them, /healthz up to 94 ms and heartbeats up to 100 ms. The attacker shares the two cores here, so the
# bound is 250 ms, which a loaded machine holds and which still fails the unbounded coordinator by far
# (a 128 MB header: /healthz p99 4.6 s, heartbeats 20 s).
P99_BOUND_S = 0.250
SIM_PORT_BASE = 27300  # the simulated agent's (unused) port range, clear of other tests' agents


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("stall")
    instance = Cluster(root=root)
    instance.server_env = {
        "MWMS_HTTP_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
        "MWMS_HTTP_KEEP_ALIVE_S": str(KEEP_ALIVE_S),
        "MWMS_HTTP_BODY_IDLE_TIMEOUT_S": str(BODY_IDLE_S),
    }
    try:
        instance.start_server()
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def probes(target: Cluster) -> Iterator[Probes]:
    with Probes(target) as running:
        yield running


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


class Probes:
    """/healthz polled every 50 ms on a connection of its own, and a simulated agent (testkit/mwms_testkit/simulator.py,
    the real protocol) sending a heartbeat every 50 ms on its Connect stream; both time every answer."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.healthz: list[tuple[float, float]] = []  # (sent at, seconds to the answer)
        self.healthz_errors: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._agent: SimAgent | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None
        self._threads = [threading.Thread(target=self._poll), threading.Thread(target=self._beat)]

    def __enter__(self) -> Probes:
        for thread in self._threads:
            thread.start()
        assert self._ready.wait(30), "the simulated agent had no heartbeat acknowledged in 30 s"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._loop is not None and self._halt is not None:
            self._loop.call_soon_threadsafe(self._halt.set)
        for thread in self._threads:
            thread.join(30)

    def _poll(self) -> None:
        with httpx.Client(base_url=self.cluster.api, timeout=60, trust_env=False) as http:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    http.get("/healthz").raise_for_status()
                except httpx.HTTPError as error:
                    self.healthz_errors.append(repr(error))
                self.healthz.append((sent, time.monotonic() - sent))
                time.sleep(POLL_S)

    def _beat(self) -> None:
        asyncio.run(self._agent_main())

    async def _agent_main(self) -> None:
        config = SimConfig(
            join_token=self.cluster.join_token,
            server=f"127.0.0.1:{self.cluster.grpc_port}",
            heartbeat_interval_s=POLL_S,
            port_base=SIM_PORT_BASE,
        )
        self._agent = SimAgent(0, config, "stall")
        await self._agent.register()
        self._loop, self._halt = asyncio.get_running_loop(), asyncio.Event()
        runner = asyncio.create_task(self._agent.run(self._halt))
        while not self._agent.heartbeats and not runner.done():
            await asyncio.sleep(0.05)
        self._ready.set()
        await self._halt.wait()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await self._agent.close()

    def during(self, attack: Callable[[], Any]) -> tuple[Any, str, float, float]:
        """Runs `attack()`; returns what it returned, a report, and the p99s (s) of /healthz and of
        heartbeats sent meanwhile, once every probe sent meanwhile has been answered."""
        since = time.monotonic()
        outcome = attack()
        until = time.monotonic()
        assert self._agent is not None
        agent = self._agent
        wait_until(
            lambda: (
                any(sent >= until for sent, _ in self.healthz)
                and not any(sent < until for sent in list(agent._pending_heartbeats))
            ),
            30,
            "the probes sent during the attack to be answered",
            interval=0.05,
        )
        healthz = [seconds for sent, seconds in self.healthz if since <= sent < until]
        beats = [seconds for sent, seconds in list(agent.heartbeats) if since <= sent < until]
        assert healthz and beats, (healthz, beats)
        report = (
            f"{until - since:.1f} s: /healthz n={len(healthz)} p99 {p99(healthz) * 1000:.1f} ms "
            f"(max {max(healthz) * 1000:.1f}), heartbeats n={len(beats)} p99 {p99(beats) * 1000:.1f} ms "
            f"(max {max(beats) * 1000:.1f}), /healthz errors {self.healthz_errors[:3]}"
        )
        print(report)
        return outcome, report, p99(healthz), p99(beats)


def again_and_again(attempt: Callable[[], dict[str, Any]], seconds: float = FLOOD_S) -> list[dict[str, Any]]:
    """`attempt()` repeated, one after another, for `seconds`."""
    outcomes = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or not outcomes:
        outcomes.append(attempt())
    return outcomes


def send_then_read(port: int, head: bytes, pieces: Iterator[bytes], done: bytes = b"}") -> dict[str, Any]:
    """Sends `head`, then `pieces` as fast as the server takes them; then reads its answer until
    `done` or the end. Records how much was sent, the answer, and the seconds it all took."""
    started = time.monotonic()
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        try:
            connection.sendall(head)
            for piece in pieces:
                connection.sendall(piece)
                sent += len(piece)
        except OSError:
            pass  # the server closed the connection: what it answered before is still to be read
        try:
            while (chunk := connection.recv(65536)) and done not in (answer := answer + chunk):
                pass
        except OSError:
            pass
    return {"sent": sent, "answer": answer, "seconds": time.monotonic() - started}


def repeated(piece: bytes, total: int) -> Iterator[bytes]:
    for _ in range(total // len(piece)):
        yield piece


def rss_mib(cluster: Cluster) -> float:
    assert cluster.server is not None
    status = Path(f"/proc/{cluster.server.popen.pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1]) / 1024


def detail(answer: bytes) -> str:
    return json.loads(answer.partition(b"\r\n\r\n")[2] or b"{}").get("detail", "")


def assert_fast(report: str, healthz_p99: float, heartbeat_p99: float) -> None:
    assert healthz_p99 < P99_BOUND_S and heartbeat_p99 < P99_BOUND_S, report


def test_a_128_mb_header_gets_431_at_once_and_the_event_loop_stays_free(
    target: Cluster, probes: Probes
) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    piece = b"a" * MiB
    before = rss_mib(target)

    def attempt() -> dict[str, Any]:
        return send_then_read(target.http_port, head, repeated(piece, 128 * MiB))

    outcomes, report, healthz_p99, heartbeat_p99 = probes.during(lambda: again_and_again(attempt))
    grown = rss_mib(target) - before
    report += f"\n{len(outcomes)} headers of 128 MB sent; RSS +{grown:.0f} MiB; first: {outcomes[0]}"[:600]
    for outcome in outcomes:
        # Loopback socket buffers take a few MB before the refusal reaches the sender.
        assert outcome["sent"] < 32 * MiB and outcome["seconds"] < 2, report
        assert outcome["answer"] == b"" or outcome["answer"].startswith(b"HTTP/1.1 431 "), report
    answered = [o["answer"] for o in outcomes if o["answer"]]
    assert answered and "MWMS_MAX_REQUEST_HEAD_BYTES" in detail(answered[0]), report
    assert grown < 50, report
    assert_fast(report, healthz_p99, heartbeat_p99)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([("X-Big", "a" * 60_000)], b"200"),
        ([("X-Big", "a" * 66_000)], b"431"),
        ([(f"X-{index}", "a") for index in range(12_000)], b"431"),  # many small ones
        ([], b"431"),  # a long URL
    ],
    ids=["60k-header", "66k-header", "12k-headers", "66k-url"],
)
def test_a_head_that_arrives_in_one_piece_is_held_to_the_bound_too(
    target: Cluster, headers: list[tuple[str, str]], status: bytes
) -> None:
    query = "" if headers else "?" + "q" * 66_000
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = f"GET /healthz{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n{lines}\r\n".encode()
    answer = send_then_read(target.http_port, head, iter([]))["answer"]
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:300]
    if status == b"431":
        assert "MWMS_MAX_REQUEST_HEAD_BYTES" in detail(answer), answer


def test_a_body_of_800k_multipart_parts_is_refused_and_the_event_loop_stays_free(
    target: Cluster, probes: Probes
) -> None:
    body = many_parts_body(800_000)
    head = (
        "POST /api/v1/bundles HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {len(body)}\r\n"
    )
    token = target.create_token("flooder", "user")

    def attempt(authorization: str = f"Authorization: Bearer {token}\r\n") -> dict[str, Any]:
        return send_then_read(target.http_port, (head + authorization + "\r\n").encode(), iter([body]))

    anonymous = attempt("")
    assert anonymous["answer"].startswith(b"HTTP/1.1 401 "), anonymous["answer"][:300]
    outcomes, report, healthz_p99, heartbeat_p99 = probes.during(lambda: again_and_again(attempt))
    report += f"\n{len(outcomes)} uploads of {len(body) / 1e6:.0f} MB; first: {outcomes[0]}"[:600]
    for outcome in outcomes:
        assert outcome["answer"].startswith(b"HTTP/1.1 400 ") and outcome["seconds"] < 2, report
        assert "more than 16 parts" in detail(outcome["answer"]), report
    assert_fast(report, healthz_p99, heartbeat_p99)
    assert target.client(token).get("/api/v1/whoami").status_code == 200  # the server is fine


def test_a_128_mb_grpc_metadata_value_is_refused_and_the_event_loop_stays_free(
    target: Cluster, probes: Probes
) -> None:
    size = 128 * MiB
    head = grpc_call_head(b"/mwms.v1.AgentService/Register", size)
    # CONTINUATION frames of the one header block, 64 to a send (16 KiB each, HTTP/2's default largest).
    frames = http2_frame(9, 0, 1, b"a" * 16384) * 64
    before = rss_mib(target)

    def attempt() -> dict[str, Any]:
        return send_then_read(target.grpc_port, head, repeated(frames, size), done=b"limit")

    outcomes, report, healthz_p99, heartbeat_p99 = probes.during(lambda: again_and_again(attempt))
    report += f"\n{len(outcomes)} calls with 128 MB of metadata; first: {outcomes[0]}"[:600]
    for outcome in outcomes:
        # gRPC skips the value as it arrives, then refuses the call (or the connection).
        assert outcome["answer"] == b"" or b"metadata size exceeds hard limit" in outcome["answer"], report
    assert_fast(report, healthz_p99, heartbeat_p99)
    # Its read buffers come and go (up to +120 MiB seen while the calls arrive). The allocator may keep
    # freed pages for a while (glibc's per-thread arenas do, on a loaded machine), so "nothing is kept" is
    # checked over two floods: what stays is bounded by a couple of calls' buffers, whatever was sent.
    second, _, _, _ = probes.during(lambda: again_and_again(attempt))
    kept = settled_rss_mib(target, before) - before
    sent_mib = sum(outcome["sent"] for outcome in [*outcomes, *second]) / MiB
    assert sent_mib >= 1024, f"the floods sent only {sent_mib:.0f} MiB: too few calls to tell"
    assert kept < 2 * size / MiB, (
        f"{report}\nRSS {before:.0f} MiB before, +{kept:.0f} MiB after {sent_mib:.0f} MiB sent"
    )


def settled_rss_mib(cluster: Cluster, before: float, seconds: float = 10) -> float:
    """The coordinator's lowest RSS (MiB) over `seconds`, or sooner once it is back within 50 MiB of `before`."""
    lowest = rss_mib(cluster)
    deadline = time.monotonic() + seconds
    while lowest - before >= 50 and time.monotonic() < deadline:
        time.sleep(0.2)
        lowest = min(lowest, rss_mib(cluster))
    return lowest


def closed_after(connection: socket.socket, drip: bytes | None, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closes `connection` (sending `drip` every 0.5 s meanwhile), and what it
    sent before closing; fails after `limit` s."""
    started = time.monotonic()
    answer = b""
    connection.settimeout(0.5)
    while time.monotonic() - started < limit:
        try:
            if drip is not None:
                connection.sendall(drip)
            chunk = connection.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started, answer
        if not chunk:
            return time.monotonic() - started, answer
        answer += chunk
    raise AssertionError(f"the connection was still open after {limit} s; it answered {answer[:300]!r}")


def test_a_slowloris_head_is_closed_at_the_head_timeout(target: Cluster) -> None:
    with socket.create_connection(("127.0.0.1", target.http_port), timeout=5) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        seconds, answer = closed_after(connection, b"a", HEAD_TIMEOUT_S + 5)
    assert HEAD_TIMEOUT_S - 0.5 < seconds < HEAD_TIMEOUT_S + 2, (seconds, answer)
    assert answer.startswith(b"HTTP/1.1 408 ") and "MWMS_HTTP_HEAD_TIMEOUT_S" in detail(answer), answer


def test_a_body_that_stops_arriving_is_closed_and_one_that_keeps_arriving_is_read(target: Cluster) -> None:
    head = b"POST /api/v1/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    body = b'{"token": "' + b"x" * 20 + b'"}'
    with socket.create_connection(("127.0.0.1", target.http_port), timeout=5) as connection:
        connection.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        seconds, answer = closed_after(connection, None, BODY_IDLE_S + 5)
    assert BODY_IDLE_S - 0.5 < seconds < BODY_IDLE_S + 2, (seconds, answer)
    # A byte every 0.5 s for longer than the idle timeout: slow, never idle, answered (a token it refuses).
    with socket.create_connection(("127.0.0.1", target.http_port), timeout=5) as connection:
        connection.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        started = time.monotonic()
        for byte in range(len(body)):
            connection.sendall(body[byte : byte + 1])
            time.sleep((BODY_IDLE_S + 1) / len(body))
        answer = connection.recv(65536)
    assert time.monotonic() - started > BODY_IDLE_S
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]


def test_idle_connections_are_closed_after_the_keep_alive_timeout(target: Cluster) -> None:
    with socket.create_connection(("127.0.0.1", target.http_port), timeout=5) as connection:
        fresh, answer = closed_after(connection, None, KEEP_ALIVE_S + 5)  # never sends a byte
    assert KEEP_ALIVE_S - 0.5 < fresh < KEEP_ALIVE_S + 2 and answer == b"", (fresh, answer)
    with socket.create_connection(("127.0.0.1", target.http_port), timeout=5) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answered = b""
        while b'"ok"' not in answered and (chunk := connection.recv(65536)):
            answered += chunk
        assert answered.startswith(b"HTTP/1.1 200 "), answered[:300]
        after_answer, answer = closed_after(connection, None, KEEP_ALIVE_S + 5)
    assert KEEP_ALIVE_S - 0.5 < after_answer < KEEP_ALIVE_S + 2 and answer == b"", (after_answer, answer)
