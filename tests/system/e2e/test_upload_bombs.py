"""Bombs and oversized uploads against a real coordinator: refused within seconds, with little memory,
no files left behind, and no effect on a job that runs meanwhile (its agents' heartbeats keep flowing)."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

from mwms_testkit.bombs import GIB, gzip_bomb, many_entries_bomb, zip_bomb
from mwms_testkit.cluster import Cluster, pack

# Bounds latencies: under pytest-xdist it runs while no other test does (tests/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.alone]

MB = 1024 * 1024
SLOW_JOB = "import time\nfor step in range(8):\n    print('step', step, flush=True)\n    time.sleep(1)\n"


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def reset_peak(pid: int) -> None:
    """Makes VmHWM start again from the current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def leftovers(bundle_dir: Path) -> list[str]:
    return sorted(p.name for p in bundle_dir.glob("*") if not (len(p.name) == 64 and p.is_file()))


def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 10) -> bytes:
    """Sends a hand-made request and returns what the server answers before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(head + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
        return answer


def test_bombs_are_refused_in_seconds_while_a_job_runs_unaffected(cluster, tmp_path: Path) -> None:
    job_id = cluster.submit({"slow.py": SLOW_JOB}, ["python", "slow.py"], workers=2)
    cluster.wait_for(job_id, {"RUNNING"}, timeout=60)
    bombs = {
        **{f"gzip-{n}": gzip_bomb(tmp_path / f"g{n}.tar.gz", 10 * GIB) for n in range(6)},
        "zip": zip_bomb(tmp_path / "z.zip", 64),
        "entries": many_entries_bomb(tmp_path / "t.tar.gz", 1 << 20),
    }
    pid = cluster.server.popen.pid
    before = memory_kib(pid)["VmRSS"]
    reset_peak(pid)
    stop = threading.Event()
    heartbeat_ages: list[float] = []

    def watch_heartbeats() -> None:
        while not stop.is_set():
            now = datetime.now(timezone.utc)
            for agent in cluster.http.get("/api/v1/agents").json():
                if agent["name"] in ("e2e-1", "e2e-2"):
                    seen = datetime.fromisoformat(agent["last_heartbeat_at"])
                    seen = seen if seen.tzinfo else seen.replace(tzinfo=timezone.utc)
                    heartbeat_ages.append((now - seen).total_seconds() if agent["online"] else 1e9)
            time.sleep(0.2)

    def upload(item: tuple[str, Path]) -> tuple[str, int, str, float]:
        name, path = item
        started = time.monotonic()
        with cluster.client(cluster.admin_token) as http, path.open("rb") as file:
            response = http.post("/api/v1/bundles", files={"file": (path.name, file)})
        return name, response.status_code, response.json()["detail"], time.monotonic() - started

    watcher = threading.Thread(target=watch_heartbeats)
    watcher.start()
    try:
        with ThreadPoolExecutor(len(bombs)) as pool:
            results = list(pool.map(upload, bombs.items()))
    finally:
        stop.set()
        watcher.join()
    memory = memory_kib(pid)
    report = "\n".join(f"{n}: {s} in {t:.2f} s: {d}" for n, s, d, t in results)
    print(
        f"{report}\nRSS before {before // 1024} MB, peak during {memory['VmHWM'] // 1024} MB, "
        f"oldest heartbeat seen {max(heartbeat_ages, default=0):.1f} s"
    )
    for _name, status, detail, seconds in results:
        assert status == 400 and "was refused" in detail and "MWMS_ARCHIVE_MAX_" in detail, report
        # Eight at once on two cores (5.2 s seen for the 1 Mi-entry tar on a slow day); unpacking any of them
        # whole would take minutes.
        assert seconds < 10, report
    assert "MWMS_ARCHIVE_MAX_ENTRIES" in dict((n, d) for n, _, d, _ in results)["entries"]
    assert memory["VmHWM"] - before < 100 * 1024, f"{before} KiB before, peak {memory['VmHWM']} KiB"
    assert leftovers(cluster.root / "data" / "bundles") == []
    assert heartbeat_ages and max(heartbeat_ages) < 6, f"heartbeat ages seen: {heartbeat_ages}"
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=60)
    assert job["state"] == "SUCCEEDED", cluster.logs_text(job_id)


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_read(cluster) -> None:
    head = (
        "POST /api/v1/bundles HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {cluster.admin_token}\r\n"
        "Content-Type: multipart/form-data; boundary=xyz\r\n"
        f"Content-Length: {int(2.3 * GIB)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    answer = raw_request(cluster.http_port, head, b"--xyz\r\n")
    assert time.monotonic() - started < 2
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"MWMS_MAX_UPLOAD_BYTES" in answer and b"2147483648 bytes" in answer


@pytest.fixture(scope="module")
def small_limits(tmp_path_factory: pytest.TempPathFactory):
    """A coordinator of its own (no agents) that takes uploads of at most 1 MiB."""
    root = tmp_path_factory.mktemp("small-limits")
    instance = Cluster(root=root)
    instance.server_env = {"MWMS_MAX_UPLOAD_BYTES": str(MB)}
    try:
        instance.start_server()
        yield instance
    finally:
        instance.stop()


def test_a_chunked_upload_is_cut_off_at_the_limit(small_limits: Cluster) -> None:
    head = (
        "POST /api/v1/bundles HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {small_limits.admin_token}\r\n"
        "Content-Type: application/gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b"\x1f\x8b" + bytes(64 * 1024 - 2)
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    sent = 0
    answer = b""
    with socket.create_connection(("127.0.0.1", small_limits.http_port), timeout=10) as connection:
        connection.sendall(head)
        connection.settimeout(0.01)
        # Sends without end; the server must answer (and stop reading) long before 256 MiB.
        while sent < 256 * MB and not answer:
            try:
                connection.sendall(chunk)
                sent += len(piece)
                answer = connection.recv(65536)
            except (TimeoutError, BlockingIOError):
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        connection.settimeout(5)
        try:
            while b"}" not in answer and (more := connection.recv(65536)):
                answer += more
        except (ConnectionResetError, TimeoutError):
            pass
    assert answer.startswith(b"HTTP/1.1 413"), (sent, answer[:300])
    assert b"MWMS_MAX_UPLOAD_BYTES" in answer and b"1048576 bytes" in answer
    assert sent < 64 * MB, sent
    assert leftovers(small_limits.root / "data" / "bundles") == []


def test_uploads_within_the_limit_work_as_multipart_and_as_a_raw_body(small_limits: Cluster) -> None:
    bundle = pack({"train.py": "print('small')"})
    multipart = small_limits.http.post("/api/v1/bundles", files={"file": ("mine.tar.gz", bundle)})
    assert multipart.status_code == 201, multipart.text
    raw = small_limits.http.post(
        "/api/v1/bundles", content=bundle, headers={"Content-Type": "application/gzip"}
    )
    assert raw.status_code == 200 and raw.json()["digest"] == multipart.json()["digest"], raw.text
    too_big = small_limits.http.post("/api/v1/bundles", files={"file": ("big.tar.gz", bundle + bytes(MB))})
    assert too_big.status_code == 413 and "MWMS_MAX_UPLOAD_BYTES" in too_big.json()["detail"]
    for body, headers in [
        (b'--x\r\nContent-Disposition: form-data; name="other"\r\n\r\nhi\r\n--x--\r\n', "x"),
        (b"not multipart at all", "x"),
    ]:
        response = small_limits.http.post(
            "/api/v1/bundles",
            content=body,
            headers={"Content-Type": f"multipart/form-data; boundary={headers}"},
        )
        assert response.status_code == 400 and "'file'" in response.json()["detail"], response.text
    wrong_type = small_limits.http.post(
        "/api/v1/bundles", content=bundle, headers={"Content-Type": "text/plain"}
    )
    assert wrong_type.status_code == 400 and "application/gzip" in wrong_type.json()["detail"]
    assert leftovers(small_limits.root / "data" / "bundles") == []
