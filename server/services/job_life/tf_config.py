"""TF_CONFIG generation, exactly in the shape the MultiWorkerMirroredStrategy page shows."""

from __future__ import annotations

import json


def build_tf_config(worker_addresses: list[str], index: int) -> str:
    """TF_CONFIG for worker `index` of a cluster; worker 0 acts as chief.

    A single worker gets one too (a cluster of one, valid for MultiWorkerMirroredStrategy): TensorFlow's
    tutorials read ``json.loads(os.environ['TF_CONFIG'])`` whatever the number of workers.
    """
    if not 0 <= index < len(worker_addresses):
        raise ValueError(f"task index {index} outside a cluster of {len(worker_addresses)} workers")
    return json.dumps(
        {"cluster": {"worker": list(worker_addresses)}, "task": {"type": "worker", "index": index}}
    )
