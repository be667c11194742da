"""`mwms server` as a process: MWMS_* variables are honoured, flags override them, the first admin token."""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import subprocess

import httpx
import pytest

from mwms_testkit.cluster import MWMS, read_ports_file, wait_until

pytestmark = pytest.mark.e2e


def _start(tmp_path, env: dict[str, str], args: list[str] = ()) -> subprocess.Popen:
    log = (tmp_path / "server.log").open("ab")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    full_env.update(env)
    return subprocess.Popen([MWMS, "server", *args], stdout=log, stderr=subprocess.STDOUT, env=full_env)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(20)


def _bound_ports(tmp_path, server: subprocess.Popen, ports_file) -> dict[str, int]:
    """The ports the coordinator wrote to its ports file (it binds port 0 here: no free-port race)."""

    def written() -> dict[str, int] | None:
        if server.poll() is not None:
            raise AssertionError(f"coordinator exited:\n{(tmp_path / 'server.log').read_text()}")
        return read_ports_file(ports_file)

    return wait_until(
        written, 60, "the coordinator's ports file", observed=(tmp_path / "server.log").read_text
    )


def test_environment_is_honoured_and_the_first_admin_token_is_written_once(tmp_path):
    data_dir, other_db, ports_file = tmp_path / "data", tmp_path / "elsewhere.db", tmp_path / "ports.json"
    env = {
        "MWMS_DATA_DIR": str(data_dir),
        "MWMS_DB_URL": f"sqlite:///{other_db}",
        "MWMS_HTTP_PORT": "0",
        "MWMS_GRPC_PORT": "0",
        "MWMS_PORTS_FILE": str(ports_file),
    }
    server = _start(tmp_path, env)
    try:
        env_port = _bound_ports(tmp_path, server, ports_file)["http"]
        wait_until(lambda: _healthy(env_port), 60, "health", observed=(tmp_path / "server.log").read_text)
        token_file = data_dir / "admin-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        me = httpx.get(
            f"http://127.0.0.1:{env_port}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}
        )
        assert me.json()["role"] == "admin"
    finally:
        _stop(server)
    log = (tmp_path / "server.log").read_text()
    assert token not in log and str(token_file) in log
    assert f"REST on 127.0.0.1:{env_port}" in log  # the bound port is logged, not the 0 asked for
    assert not (data_dir / "mwms.db").exists()
    tables = {row[0] for row in sqlite3.connect(other_db).execute("SELECT name FROM sqlite_master")}
    assert {"jobs", "tokens"} <= tables

    # A flag overrides its variable: the variable names a port this test holds, the flag asks for any;
    # the admin token is kept, not made again.
    ports_file.unlink()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        env["MWMS_HTTP_PORT"] = str(held.getsockname()[1])
        server = _start(tmp_path, env, ["--http-port", "0"])
        try:
            flag_port = _bound_ports(tmp_path, server, ports_file)["http"]
            assert flag_port != held.getsockname()[1]
            wait_until(
                lambda: _healthy(flag_port), 60, "health", observed=(tmp_path / "server.log").read_text
            )
            assert token_file.read_text().strip() == token
            headers = {"Authorization": f"Bearer {token}"}
            assert (
                httpx.get(f"http://127.0.0.1:{flag_port}/api/v1/tokens", headers=headers).status_code == 200
            )
            assert len(httpx.get(f"http://127.0.0.1:{flag_port}/api/v1/tokens", headers=headers).json()) == 1
        finally:
            _stop(server)


def test_a_second_coordinator_on_one_sqlite_database_exits_at_once_and_says_to_use_postgresql(tmp_path):
    """SQLite stays single (issue 19): replicas need PostgreSQL, and the refusal says so."""
    data_dir, ports_file = tmp_path / "data", tmp_path / "ports.json"
    env = {"MWMS_DATA_DIR": str(data_dir), "MWMS_HTTP_PORT": "0", "MWMS_GRPC_PORT": "0"}
    first = _start(tmp_path, {**env, "MWMS_PORTS_FILE": str(ports_file)})
    try:
        port = _bound_ports(tmp_path, first, ports_file)["http"]
        second = subprocess.run(
            [MWMS, "server"],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        assert "exactly one coordinator" in second.stderr and "postgresql+psycopg://" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert _healthy(port)  # the first one runs on, undisturbed
    finally:
        _stop(first)
