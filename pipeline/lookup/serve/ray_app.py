"""``elmo serve --ray-address ADDR --replicas N``: the same FastAPI app on Ray Serve.

Each replica is a Ray actor that opens the dataset, its indexes and the model itself
(``ServedStore.open``) and builds the app with ``create_app``: the routes, the guard, the
batching and the explorer page are those of the single-process server. Ray Serve's proxy
listens on ``--host``/``--port`` and spreads requests over the replicas.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from pipeline.lookup.serve.limits import SQL_TIMEOUT_S

APP_NAME = "elmo-serve"


@dataclass
class ReplicaSettings:
    dataset: str
    indexes: list[str]
    model_dir: str | None = None
    sql_timeout_s: float = SQL_TIMEOUT_S
    token: str | None = None


def _replica_class() -> Any:
    from ray import serve

    # Late-bound ingress: Ray Serve calls __serve_build_asgi_app__ on each replica after
    # its constructor, so the app is built around that replica's own store.
    @serve.ingress()
    class ElmoReplica:
        def __init__(self, settings: ReplicaSettings) -> None:
            from pipeline.lookup.serve.resources import ServedStore

            self.settings = settings
            self.store = ServedStore.open(settings.dataset, settings.indexes,
                                          settings.model_dir, settings.sql_timeout_s)

        def __serve_build_asgi_app__(self) -> Any:
            from pipeline.lookup.serve.app import create_app

            return create_app(self.store, self.settings.token)

    return ElmoReplica


def deploy(settings: ReplicaSettings, ray_address: str, replicas: int, host: str,
           port: int, cpus_per_replica: float = 1.0) -> None:
    """Start (or join) Ray, run the app with ``replicas`` replicas; returns once they all
    answer."""
    import logging

    if ray_address == "local":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60: token auth by default
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=None if ray_address == "local" else ray_address,
                 logging_level=logging.WARNING, log_to_driver=False, include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    deployment = serve.deployment(
        _replica_class(), name="elmo", num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica},
        # One replica at a time takes requests in batches itself: let many wait on it.
        max_ongoing_requests=256)
    serve.run(deployment.bind(settings), name=APP_NAME, route_prefix="/")


def wait_until_interrupted() -> None:
    from ray import serve

    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    print("stopping the Ray Serve application (Ctrl-C again: leave it to Ray)",
          file=sys.stderr, flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: no traceback
        serve.shutdown()
