"""A throwaway PostgreSQL server for the tests and the benchmarks: initdb in a temp dir, pg_ctl on loopback.

Used by tests/system/server/test_postgres.py (a fixture) and bench/run.py --db postgres, which both already import
from this folder (testkit/mwms_testkit/cluster.py). The cluster runs with PostgreSQL's defaults (fsync, synchronous_commit
and full_page_writes on, shared_buffers 128 MB), trusts connections from loopback and its own socket only,
and is stopped and removed when the context ends, Ctrl-C included. When run as root the server runs as the
`postgres` user (PostgreSQL refuses root), through runuser.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mwms_testkit.cluster import free_port

BIN_DIRS = ("/usr/lib/postgresql/15/bin",)
SUPERUSER = "mwms"
START_ATTEMPTS = 3


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here (binaries missing, or initdb/pg_ctl failed): says why."""


@dataclass
class PostgresServer:
    """A running throwaway cluster; `url` is its `postgres` database, `create_database` makes fresh ones."""

    root: Path
    port: int

    @property
    def url(self) -> str:
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{name}"

    def create_database(self, name: str) -> str:
        """Creates an empty database (dropping one of that name first) and returns its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres") as conn:
            conn.autocommit = True
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join((self.root / "log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in BIN_DIRS:
        if (Path(folder) / name).exists():
            return str(Path(folder) / name)
    return None


def _run_as_postgres(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@contextmanager
def postgres_server(settings: dict[str, str] | None = None) -> Iterator[PostgresServer]:
    """Starts a fresh PostgreSQL cluster on a free loopback port; stops and deletes it on exit.

    `settings` are extra `-c name=value` server settings. Raises PostgresUnavailable when none can start.
    """
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    root = Path(tempfile.mkdtemp(prefix="mwms-pg-"))
    os.chmod(root, 0o777)  # the postgres user writes its data, socket and log here
    data = root / "data"
    started = False
    try:
        result = _run_as_postgres([initdb, "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8"])
        if result.returncode != 0:
            raise PostgresUnavailable(
                f"cannot initialise a PostgreSQL cluster: {result.stderr.strip()[:300]}"
            )
        options = " ".join(f"-c {name}={value}" for name, value in (settings or {}).items())
        # The port is free when chosen but may be taken before the server binds it: try another then.
        for _ in range(START_ATTEMPTS):
            port = free_port()
            server_options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 {options}".strip()
            command = [pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-o", server_options, "start"]
            result = _run_as_postgres(command)
            if result.returncode == 0:
                started = True
                break
        if not started:
            tail = PostgresServer(root, 0).log_tail(10)
            raise PostgresUnavailable(f"cannot start PostgreSQL: {result.stderr.strip()[:300]}\n{tail}")
        yield PostgresServer(root, port)
    finally:
        # Also when interrupted while starting: a postmaster that wrote its pid file is stopped.
        if started or (data / "postmaster.pid").exists():
            _run_as_postgres([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"])
        time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)
