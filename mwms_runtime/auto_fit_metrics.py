"""fit's own logs as metrics without a code change: every tf_keras ``Model.fit`` gets a MetricsCallback.

The agent's task hook (worker_agent/stack_handler/_mwms_fit_metrics.py) calls ``patch_fit`` once
tf_keras is imported in a task; a job opts out with MWMS_AUTO_METRICS=0. The patched ``fit`` appends
``MetricsCallback()`` to its callbacks unless the program already passes one (then it reports as the
program asked), and otherwise calls tf_keras's own ``fit`` unchanged. Whatever goes wrong while adding
the callback prints one line (once per process) and ``fit`` runs without it.
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import ModuleType
from typing import Any

# Set on the patched fit, so that patching twice (two hooks, a reload) wraps it once.
PATCHED_MARK = "__mwms_fit_metrics__"
_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(f"mwms_runtime: {message}", file=sys.stderr, flush=True)


def with_metrics_callback(callbacks: Any, callback_class: type) -> Any:
    """`callbacks` as fit got them, with a `callback_class()` appended unless one is there already.

    None and lists or tuples of callbacks are extended; anything else (a CallbackList the program built)
    is the program's own business and is returned unchanged.
    """
    if callbacks is None:
        return [callback_class()]
    if isinstance(callbacks, (list, tuple)):
        if any(isinstance(callback, callback_class) for callback in callbacks):
            return callbacks
        return [*callbacks, callback_class()]
    return callbacks


def _callback_class(tf_keras: ModuleType) -> type | None:
    """MetricsCallback, when it is a tf_keras callback here (tf.keras is tf_keras), else None."""
    from mwms_runtime.keras_callback import MetricsCallback

    if issubclass(MetricsCallback, tf_keras.callbacks.Callback):
        return MetricsCallback
    return None


def patch_fit(tf_keras: ModuleType) -> bool:
    """Makes `tf_keras.Model.fit` add a MetricsCallback; False when it was patched already."""
    model_class = tf_keras.Model
    original = model_class.fit
    if getattr(original, PATCHED_MARK, False):
        return False
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # tf_keras says what is wrong with the call
        try:
            callback_class = _callback_class(tf_keras)
            if callback_class is None:
                _say_once(
                    "fit's logs are not recorded as metrics: tf.keras is not tf_keras in this process "
                    "(TF_USE_LEGACY_KERAS=0), and MultiWorkerMirroredStrategy's fit needs tf_keras"
                )
            else:
                bound.arguments["callbacks"] = with_metrics_callback(
                    bound.arguments.get("callbacks"), callback_class
                )
        except Exception as error:  # noqa: BLE001 - the program's fit runs whatever happens here
            _say_once(
                f"fit's logs are not recorded as metrics ({type(error).__name__}: {error}); "
                "add mwms_runtime.MetricsCallback() to fit's callbacks to record them"
            )
            return original(self, *args, **kwargs)
        return original(*bound.args, **bound.kwargs)

    setattr(fit, PATCHED_MARK, True)
    model_class.fit = fit
    return True
