"""Loaded by this directory's sitecustomize in every task: records tf_keras ``Model.fit``'s logs as metrics.

When MWMS_METRICS_FILE is set (the agent sets it for every task) and MWMS_AUTO_METRICS is not "0", an
import hook waits for ``tf_keras`` to be imported (``import tf_keras``, or ``tf.keras`` with
TF_USE_LEGACY_KERAS=1) and then hands it to ``mwms_runtime.auto_fit_metrics.patch_fit``, which makes
every ``fit`` add mwms_runtime's MetricsCallback, once. Nothing else is imported until then, so a
program that never uses tf_keras pays for one entry in ``sys.meta_path``. Any failure prints one line
to stderr and the program runs on as if the hook were not there.

Depends on nothing but the standard library until tf_keras is imported; spells its variables itself
(a test ties them to mwms/task_environment.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

ENABLE_ENV = "MWMS_AUTO_METRICS"
METRICS_FILE_ENV = "MWMS_METRICS_FILE"
WATCHED_MODULE = "tf_keras"


def _say(message: str) -> None:
    try:
        print(f"mwms: {message}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001, S110 - a closed stderr must not end the program
        pass


def _patch(module: ModuleType) -> None:
    try:
        from mwms_runtime.auto_fit_metrics import patch_fit

        patch_fit(module)
    except Exception as error:  # noqa: BLE001 - the program runs on without the metrics
        _say(
            f"fit's logs are not recorded as metrics ({type(error).__name__}: {error}); "
            "add mwms_runtime.MetricsCallback() to fit's callbacks to record them"
        )


class _PatchAfterExec(importlib.abc.Loader):
    """The watched module's own loader, then the patch; the module keeps its own loader afterwards."""

    def __init__(self, loader: Any, watcher: _WatchImport) -> None:
        self._loader = loader
        self._watcher = watcher

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._watcher.remove()
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:  # resources, get_source...: the real loader's
        return getattr(self._loader, name)


class _WatchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of WATCHED_MODULE's spec until the module is executed.

    It stays in sys.meta_path until then: a mere ``importlib.util.find_spec("tf_keras")`` (TensorFlow
    asks it to learn whether tf_keras is installed) gets a spec too, and the import comes later.
    """

    def __init__(self) -> None:
        self._looking = False

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(
        self, name: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != WATCHED_MODULE or self._looking:
            return None
        self._looking = True  # the real finders are asked below, this one must not answer itself
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, path, target)
                    if spec is not None:
                        break
        except Exception:  # noqa: BLE001 - the import itself will raise what the program expects
            return None
        finally:
            self._looking = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchAfterExec(spec.loader, self)
        return spec


def install() -> None:
    """Watches for tf_keras in a task (MWMS_METRICS_FILE set) unless MWMS_AUTO_METRICS=0."""
    if os.environ.get(ENABLE_ENV, "").strip() == "0" or not os.environ.get(METRICS_FILE_ENV):
        return
    if WATCHED_MODULE in sys.modules:  # imported by an earlier sitecustomize or .pth: patch it now
        _patch(sys.modules[WATCHED_MODULE])
        return
    sys.meta_path.insert(0, _WatchImport())
