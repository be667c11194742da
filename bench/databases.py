"""The database the benchmark's coordinators use: SQLite in each one's data dir, or PostgreSQL.

With PostgreSQL, one throwaway server (testkit/mwms_testkit/postgres_server.py, the one the test suite starts) serves the
whole run and each scenario gets a fresh database in it, handed to its coordinator as MWMS_DB_URL. The server
runs with PostgreSQL's defaults (fsync and synchronous_commit on) plus pg_stat_statements, so each scenario
can record the statements that took the database's time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mwms_testkit.postgres_server import PostgresServer, postgres_server

CHOICES = ("sqlite", "postgres")
# Loaded at server start so every statement is counted; the extension is created in each database.
POSTGRES_SETTINGS = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}


@dataclass
class BenchDatabase:
    """Which database a scenario's coordinator stores its state in."""

    kind: str
    server: PostgresServer | None = None

    def fresh(self, scenario: str) -> str | None:
        """A SQLAlchemy URL of a new empty database for `scenario`, or None for the coordinator's own SQLite."""
        if self.server is None:
            return None
        url = self.server.create_database(f"bench_{scenario}")
        with _connect(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return url

    def server_env(self, url: str | None) -> dict[str, str]:
        """The coordinator's environment for a database from `fresh`."""
        return {"MWMS_DB_URL": url} if url else {}

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (its backends are its children), for CPU accounting."""
        if self.server is None:
            return None
        try:
            return int((self.server.root / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def top_statements(self, url: str | None, limit: int = 8) -> list[dict[str, object]]:
        """The statements of this database that took the most time since the last reset, for the results."""
        if not url:
            return []
        with _connect(url) as conn:
            rows = conn.execute(
                "SELECT s.calls, s.total_exec_time, s.mean_exec_time, s.rows, s.query "
                "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = current_database() ORDER BY s.total_exec_time DESC LIMIT %s",
                (limit,),
            ).fetchall()
        return [
            {
                "calls": calls,
                "total_ms": round(total, 1),
                "mean_ms": round(mean, 3),
                "rows": count,
                "query": " ".join(query.split())[:300],
            }
            for calls, total, mean, count, query in rows
        ]


def _connect(url: str) -> Any:
    """A psycopg connection in autocommit (psycopg is imported only when PostgreSQL is used)."""
    import psycopg

    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


@contextmanager
def bench_database(kind: str) -> Iterator[BenchDatabase]:
    """The database for a whole benchmark run; a PostgreSQL server is stopped and removed at the end."""
    if kind == "sqlite":
        yield BenchDatabase(kind)
        return
    with postgres_server(POSTGRES_SETTINGS) as server:
        print(f"PostgreSQL on 127.0.0.1:{server.port} ({Path(server.root)})", flush=True)
        yield BenchDatabase(kind, server)
