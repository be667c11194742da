"""ReducedMetrics: metric values already reduced over every replica, so report() writes them without a collective.

Dependency-free so that reporting.py can recognise it without importing TensorFlow.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ReducedMetrics(NamedTuple):
    """What ``reduce_metrics`` returns inside a ``tf.function``; pass it to ``report(step, reduced)``.

    ``values`` maps each metric name to its reduced scalar (float64 tensor), identical on every worker.
    ``agreed`` is a scalar bool tensor: True when every worker reduced the same names with the same ops
    in this collective. A NamedTuple, so a ``tf.function`` can return it (alone or inside a tuple or dict).
    """

    values: dict[str, Any]
    agreed: Any
