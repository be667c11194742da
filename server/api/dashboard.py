"""Serves the web dashboard: web/index.html at `/` and the files under web/ at `/static/...`.

The dashboard is plain ES modules and CSS with no build step, so the files are served as they are in the
repository. Every response carries a strict Content-Security-Policy (server/api/security_headers.py): the
page runs only our own scripts and talks only to this coordinator, so a job name or log line that smuggles
HTML can never execute. The shell and its files are public; the data they show needs a log-in.
"""

from __future__ import annotations

import logging
import mimetypes
from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from mwms.server.errors import NotFound

# The dashboard ships inside the mwms package (mwms/web; in a source checkout a link to web/).
WEB_DIR = Path(str(resources.files("mwms") / "web"))

log = logging.getLogger("mwms.server")

# Browsers refuse ES modules served with a non-JavaScript type under nosniff, and the platform's
# mimetypes table varies, so the types the dashboard uses are fixed here.
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
    ".txt": "text/plain; charset=utf-8",
    ".woff2": "font/woff2",
}

router = APIRouter(include_in_schema=False)


def resolve_static_path(web_dir: Path, relative: str) -> Path | None:
    """The file under web_dir named by relative, or None when it is missing or lies outside web_dir."""
    if not relative or "\x00" in relative or "\\" in relative:
        return None
    parts = relative.split("/")
    # Hidden files (editor swap files, .gitignore) are not part of the dashboard.
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        return None
    root = web_dir.resolve()
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    return candidate


def _media_type(path: Path) -> str:
    known = _MEDIA_TYPES.get(path.suffix.lower())
    if known:
        return known
    guessed, _ = mimetypes.guess_type(path.name)
    return guessed or "application/octet-stream"


@router.get("/")
def dashboard_index() -> Response:
    """The single-page dashboard; its hash routes (#/jobs, #/jobs/<id>, #/agents) are handled in the browser."""
    index = WEB_DIR / "index.html"
    if not index.is_file():
        log.error("the dashboard's index.html is missing: %s", index)
        raise NotFound("the dashboard's files are missing from this installation; reinstall mwms[server]")
    return FileResponse(index, media_type=_MEDIA_TYPES[".html"])


@router.get("/static/{relative:path}")
def dashboard_static(relative: str) -> Response:
    """A file of the dashboard (scripts, styles, icons, vendored libraries)."""
    path = resolve_static_path(WEB_DIR, relative)
    if path is None:
        return Response(
            status_code=404,
            content=f"not found: /static/{relative}",
            media_type="text/plain; charset=utf-8",
        )
    return FileResponse(path, media_type=_media_type(path))
