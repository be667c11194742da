"""Alembic: upgrade to head, schema equals the models, downgrade to base removes everything."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from mwms.server.db.engine import Database
from mwms.server.db.migrate import downgrade_to, upgrade_to_head
from mwms.server.db.models import Base


def test_upgrade_check_downgrade(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade_to_head(db.engine)
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"
    downgrade_to(db.engine, "base")
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    upgrade_to_head(db.engine)
    assert "jobs" in inspect(db.engine).get_table_names()
    db.dispose()


def test_sqlite_is_tuned(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 't.db'}")
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    db.dispose()
