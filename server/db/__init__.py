"""SQL storage: models, engine and session set-up, Alembic migrations."""
