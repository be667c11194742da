"""Save paths for multi-worker saving: every worker must save, only the chief's copy is kept.

Saving a model or checkpoint under MWMS runs collectives, so every worker has to do it; to avoid races
each non-chief worker writes to its own temporary path (under TMPDIR when set), which is removed after
the save, and at the latest when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator

from mwms_runtime.env import context

_temp_roots: set[str] = set()
_lock = threading.Lock()
_cleanup_registered = False


def write_path(base: str) -> str:
    """Return ``base`` on the chief; on other workers a fresh temporary path ending in base's name."""
    ctx = context()
    if ctx.is_chief:
        parent = os.path.dirname(os.path.abspath(base))
        os.makedirs(parent, exist_ok=True)
        return base
    global _cleanup_registered
    root = tempfile.mkdtemp(prefix=f"mwms-worker-{ctx.task_index}-")
    with _lock:
        _temp_roots.add(root)
        if not _cleanup_registered:
            atexit.register(cleanup_all)
            _cleanup_registered = True
    name = os.path.basename(os.path.normpath(base)) or "save"
    return os.path.join(root, name)


def cleanup_write_path(path: str) -> None:
    """Remove a temporary path that write_path() gave a non-chief worker; the chief's path is kept."""
    root = os.path.dirname(os.path.abspath(path))
    with _lock:
        if root not in _temp_roots:
            return
        _temp_roots.discard(root)
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def saving(base: str) -> Iterator[str]:
    """Yield write_path(base) and remove it afterwards when it is a non-chief temporary path."""
    path = write_path(base)
    try:
        yield path
    finally:
        cleanup_write_path(path)


def cleanup_all() -> None:
    """Remove every temporary path write_path() created in this process and that is still there."""
    with _lock:
        roots = list(_temp_roots)
        _temp_roots.clear()
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)
