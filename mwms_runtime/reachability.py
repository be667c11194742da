"""Phase 1 of the preflight check, without TensorFlow: can every worker reach every other on its TF_CONFIG port?

Each worker listens on its own port and connects to every peer's, retrying until a deadline because peers
start at slightly different moments. A connection says hello with the worker's index and the peer answers
with its own, so a port held by something else (or a mixed-up TF_CONFIG) is noticed too. With
`stream_bytes`, each worker i also streams that many bytes to worker (i + 1) mod n over a plain socket and
the receiver times them: the raw TCP bandwidth `mwms doctor` sets beside the all-reduce figures.

The listener closes once every peer has said hello (and the stream, if any, has arrived), so TensorFlow can
bind the same port right after. The connecting side closes first, leaving TIME_WAIT on its ephemeral port,
not on the listened one; SO_REUSEADDR covers the rest.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

HELLO = "mwms-preflight hello"
STREAM = "mwms-preflight stream"
CHUNK = 1 << 20
# Longest wait for one connect() try, so a silently dropped SYN is retried within the deadline.
CONNECT_TRY_S = 1.0
# The listening side waits this much longer than the connecting side: a worker that cannot connect names
# the address it could not reach, which says more than "no hello arrived", so its report should come first.
LISTEN_GRACE_S = 2.0


@dataclass(frozen=True)
class Endpoint:
    """One worker of the gang as TF_CONFIG names it."""

    index: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Reachability:
    """What phase 1 found: per-peer connect times, the TCP stream figures, and the first failure."""

    connect_s: dict[int, float] = field(default_factory=dict)
    heard_from: set[int] = field(default_factory=set)
    tcp_sent: dict[str, float] | None = None
    tcp_received: dict[str, float] | None = None
    failure: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failure


def describe_worker(endpoint: Endpoint) -> str:
    return f"worker {endpoint.index} (host {endpoint.host})"


class _Listener:
    """Accepts peers' hellos and the predecessor's stream on this worker's port, in background threads."""

    def __init__(self, me: Endpoint, bind_host: str) -> None:
        self.me = me
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((bind_host, me.port))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.heard_from: set[int] = set()
        self.received: dict[str, float] | None = None
        self.changed = threading.Condition()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="preflight-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(2.0)
        self.sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(60.0)
                words = _read_line(conn).split()
                if " ".join(words[:2]) == HELLO and len(words) == 3:
                    conn.sendall(f"ok {self.me.index}\n".encode())
                    _read_until_eof(conn)  # the peer closes first: TIME_WAIT stays on its side
                    with self.changed:
                        self.heard_from.add(int(words[2]))
                        self.changed.notify_all()
                elif " ".join(words[:2]) == STREAM and len(words) == 4:
                    sender, size = int(words[2]), int(words[3])
                    started = time.perf_counter()
                    got = _read_exactly(conn, size)
                    seconds = max(time.perf_counter() - started, 1e-9)
                    conn.sendall(f"done {seconds:.9f}\n".encode())
                    _read_until_eof(conn)
                    with self.changed:
                        self.received = {"from_worker": sender, "bytes": got, "seconds": seconds}
                        self.changed.notify_all()
            except (OSError, ValueError):
                return


def _read_line(conn: socket.socket, limit: int = 256) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = conn.recv(1)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _read_until_eof(conn: socket.socket) -> None:
    while conn.recv(4096):
        pass


def _read_exactly(conn: socket.socket, size: int) -> int:
    got = 0
    while got < size:
        chunk = conn.recv(min(CHUNK, size - got))
        if not chunk:
            break
        got += len(chunk)
    return got


def _connect(peer: Endpoint, deadline: float) -> tuple[socket.socket | None, str]:
    """A connection to `peer`, retried until `deadline`; (None, last error) when none could be made."""
    last = "no attempt was made"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, last
        try:
            return socket.create_connection((peer.host, peer.port), timeout=min(CONNECT_TRY_S, remaining)), ""
        except TimeoutError:
            last = "connection timed out"
        except ConnectionRefusedError:
            last = "connection refused"
        except OSError as error:
            last = error.strerror or str(error)
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _say_hello(me: Endpoint, peer: Endpoint, deadline: float, timeout_s: float) -> str:
    """Connects to `peer` and exchanges indexes; an empty string, or why it failed."""
    prefix = f"{describe_worker(me)} cannot reach worker {peer.index} at {peer.address}"
    hint = "check the firewall between the hosts and the agent's --advertise-address"
    conn, error = _connect(peer, deadline)
    if conn is None:
        return f"{prefix}: {error} after {timeout_s:g} s; {hint}"
    with conn:
        try:
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            conn.sendall(f"{HELLO} {me.index}\n".encode())
            answer = _read_line(conn).split()
        except OSError as exc:
            return f"{prefix}: the connection broke during the hello ({exc}); {hint}"
    if answer != ["ok", str(peer.index)]:
        return (
            f"{describe_worker(me)} reached {peer.address} but it did not answer as worker {peer.index} "
            f"(answer {' '.join(answer)[:80]!r}): another program holds the port, or TF_CONFIG is wrong"
        )
    return ""


def _stream(me: Endpoint, peer: Endpoint, size: int, deadline: float) -> tuple[dict[str, float] | None, str]:
    """Streams `size` bytes to `peer`; (figures, "") or (None, why it failed)."""
    conn, error = _connect(peer, deadline)
    if conn is None:
        return (
            None,
            f"{describe_worker(me)} could not stream to worker {peer.index} at {peer.address}: {error}",
        )
    payload = b"\0" * CHUNK
    with conn:
        try:
            conn.settimeout(max(5.0, deadline - time.monotonic()))
            conn.sendall(f"{STREAM} {me.index} {size}\n".encode())
            sent = 0
            while sent < size:
                view = payload[: min(CHUNK, size - sent)]
                conn.sendall(view)
                sent += len(view)
            words = _read_line(conn).split()
            seconds = float(words[1]) if len(words) == 2 and words[0] == "done" else 0.0
        except (OSError, ValueError) as exc:
            return None, f"{describe_worker(me)} lost the stream to worker {peer.index}: {exc}"
    if seconds <= 0:
        return None, f"worker {peer.index} did not confirm the stream from worker {me.index}"
    return {"to_worker": peer.index, "bytes": size, "seconds": seconds, "gbps": size / seconds / 1e9}, ""


def check_reachability(
    endpoints: list[Endpoint],
    my_index: int,
    timeout_s: float,
    stream_bytes: int = 0,
    bind_host: str = "",
) -> Reachability:
    """Runs phase 1 for worker `my_index` of `endpoints`; the port is released when it returns."""
    started = time.monotonic()
    result = Reachability()
    me = endpoints[my_index]
    peers = [e for e in endpoints if e.index != my_index]
    try:
        listener = _Listener(me, bind_host)
    except OSError as error:
        result.failure = (
            f"{describe_worker(me)} cannot listen on its port {me.port}: {error.strerror or error}; "
            "another program holds it"
        )
        return result
    try:
        deadline = started + timeout_s
        for peer in peers:
            failure = _say_hello(me, peer, deadline, timeout_s)
            if failure:
                result.failure = failure
                return result
            result.connect_s[peer.index] = time.monotonic() - started
        successor = endpoints[(my_index + 1) % len(endpoints)]
        if stream_bytes and peers:
            result.tcp_sent, failure = _stream(me, successor, stream_bytes, deadline + 60.0)
            if failure:
                result.failure = failure
                return result
        expected = {p.index for p in peers}
        wait_until = deadline + LISTEN_GRACE_S + (60.0 if stream_bytes else 0.0)
        with listener.changed:
            while not (
                expected <= listener.heard_from and (not stream_bytes or not peers or listener.received)
            ):
                remaining = wait_until - time.monotonic()
                if remaining <= 0:
                    break
                listener.changed.wait(remaining)
            result.heard_from = set(listener.heard_from)
            result.tcp_received = listener.received
        missing = sorted(expected - result.heard_from)
        if missing:
            by_index = {e.index: e for e in endpoints}
            names = ", ".join(f"worker {i} (host {by_index[i].host})" for i in missing)
            result.failure = (
                f"{names} did not reach {describe_worker(me)} at {me.address} within {timeout_s:g} s; "
                "check the firewall between the hosts and the agent's --advertise-address"
            )
        elif stream_bytes and peers and not result.tcp_received:
            result.failure = f"no TCP stream arrived at {describe_worker(me)} from its predecessor"
        return result
    finally:
        listener.close()
        result.seconds = time.monotonic() - started
