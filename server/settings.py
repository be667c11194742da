"""Coordinator settings: one pydantic-settings class, environment prefix MWMS_, passed in explicitly."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the coordinator can be told; CLI flags override environment variables."""

    model_config = SettingsConfigDict(env_prefix="MWMS_")

    host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int = 50051
    data_dir: Path = Path("mwms-data")
    db_url: str | None = Field(default=None, description="SQLAlchemy URL; default: SQLite in data_dir")
    # Agents must present this token when it is set.
    join_token: str = ""
    heartbeat_interval_s: float = 2.0
    # An agent that has not been heard from for this long is lost; its attempts end.
    agent_timeout_s: float = 10.0
    # After a coordinator start, agents get this long (plus agent_timeout_s) to reconnect before they count
    # as lost; it must exceed the agents' longest reconnect backoff (10 s with jitter).
    reconnect_grace_s: float = 20.0
    scheduler_interval_s: float = 0.5
    # Grace between SIGTERM and SIGKILL when a task is stopped.
    stop_grace_s: int = 10
    # Backoff before a failed attempt is placed again (doubles per restart, capped at 60 s).
    restart_backoff_s: float = 2.0
    # Default for jobs that do not set startup_timeout_s.
    startup_timeout_s: float = 300.0
    max_upload_bytes: int = 2 * 1024**3
    # A shared filesystem path for checkpoints; empty: agents ship checkpoints through the coordinator.
    shared_checkpoint_dir: str = ""

    @property
    def database_url(self) -> str:
        """The SQLAlchemy URL in force."""
        if self.db_url:
            return self.db_url
        return f"sqlite:///{(self.data_dir / 'mwms.db').resolve()}"

    @property
    def bundle_dir(self) -> Path:
        return self.data_dir / "bundles"

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"
