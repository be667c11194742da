"""The first admin token: generated on the first start into a 0600 file, or taken from MWMS_ADMIN_TOKEN."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mwms.server.db.engine import Database
from mwms.server.services.auth.tokens import Role, create_api_token, ensure_admin_token, has_usable_admin
from mwms.server.settings import Settings

log = logging.getLogger("mwms.server")


def write_secret_file(path: Path, secret: str) -> None:
    """Writes `secret` to `path`, readable by its owner only, never world-readable even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(secret + "\n")


def bootstrap_admin_token(db: Database, settings: Settings) -> None:
    """Makes sure someone can administer the coordinator, and says how, without printing a secret."""
    given = settings.admin_token.get_secret_value()
    path = settings.admin_token_file
    with db.write() as session:
        if given:
            ensure_admin_token(session, given)
            log.info("MWMS_ADMIN_TOKEN is an admin token")
            return
        if has_usable_admin(session):
            if path.is_file():
                log.info(
                    "the first admin token is in %s (use it with: mwms login --token-file %s)", path, path
                )
            return
        _, secret = create_api_token(
            session, "admin", Role.ADMIN, "first admin token", created_by="mwms server"
        )
        write_secret_file(path, secret)
    log.info("created an admin token in %s; log in with: mwms login --token-file %s", path, path)
