"""Schema migrations through Alembic: the server upgrades to head at start.

On PostgreSQL the upgrade runs under the migration advisory lock (server/db/locks.py): replicas starting
together upgrade once, one after the other, and each later one finds the schema at head. PostgreSQL's DDL is
transactional, so a replica killed mid-upgrade leaves the schema as it was.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

from mwms.server.db import locks

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at our migrations and the given database."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_to_head(engine: Engine) -> None:
    """Brings the schema up to the newest revision."""
    config = alembic_config(str(engine.url))
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            locks.wait_for(connection, locks.MIGRATIONS)
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def downgrade_to(engine: Engine, revision: str) -> None:
    """Takes the schema down to `revision` ("base" removes every table)."""
    config = alembic_config(str(engine.url))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
