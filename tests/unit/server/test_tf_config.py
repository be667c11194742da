"""TF_CONFIG exactly as the MultiWorkerMirroredStrategy page shows it."""

from __future__ import annotations

import json

import pytest

from mwms.server.services.job_life.tf_config import build_tf_config


def test_matches_the_page_shape_for_each_worker():
    cluster = ["localhost:12345", "localhost:23456"]
    for index in range(2):
        config = json.loads(build_tf_config(cluster, index))
        assert config == {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}


def test_single_worker_gets_a_cluster_of_one():
    # TensorFlow's tutorials read json.loads(os.environ["TF_CONFIG"]) with any number of workers.
    config = json.loads(build_tf_config(["h:1"], 0))
    assert config == {"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}


def test_index_outside_cluster_is_refused():
    with pytest.raises(ValueError):
        build_tf_config(["a:1", "b:2"], 2)
