"""`mwms server` as a process: MWMS_* variables are honoured, flags override them, the first admin token."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess

import httpx
import pytest

from cluster import MWMS, free_port, wait_until

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


def test_environment_is_honoured_and_the_first_admin_token_is_written_once(tmp_path):
    data_dir, other_db = tmp_path / "data", tmp_path / "elsewhere.db"
    env_port, flag_port = free_port(), free_port()
    env = {
        "MWMS_DATA_DIR": str(data_dir),
        "MWMS_DB_URL": f"sqlite:///{other_db}",
        "MWMS_HTTP_PORT": str(env_port),
        "MWMS_GRPC_PORT": str(free_port()),
    }
    server = _start(tmp_path, env)
    try:
        wait_until(lambda: _healthy(env_port), 60, (tmp_path / "server.log").read_text)
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
    assert not (data_dir / "mwms.db").exists()
    tables = {row[0] for row in sqlite3.connect(other_db).execute("SELECT name FROM sqlite_master")}
    assert {"jobs", "tokens"} <= tables

    # A flag overrides its variable; the admin token is kept, not made again.
    server = _start(tmp_path, env, ["--http-port", str(flag_port)])
    try:
        wait_until(lambda: _healthy(flag_port), 60, (tmp_path / "server.log").read_text)
        assert token_file.read_text().strip() == token
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"http://127.0.0.1:{flag_port}/api/v1/tokens", headers=headers).status_code == 200
        assert len(httpx.get(f"http://127.0.0.1:{flag_port}/api/v1/tokens", headers=headers).json()) == 1
    finally:
        _stop(server)
