"""A real Ray cluster for the engine tests: a head and one more node on this machine (``ray start``), one
CPU and a 100 MB object store each, token authentication on, its own temp folder and ports; stopped after,
with no Ray process of it left."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from keyshot.infer.engines.ray_cluster import LocalCluster, use_token


@contextlib.contextmanager
def ray_cluster(nodes: int = 2) -> Iterator[LocalCluster]:
    cluster = LocalCluster(nodes=nodes, cpus=1)
    saved = {key: os.environ.get(key) for key in cluster.env}
    cluster.start()
    use_token(cluster.env)
    try:
        yield cluster
    finally:
        cluster.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        left = cluster.leftover()
        assert not left, f"Ray processes left after the cluster stopped: {left}"
