"""``elmo serve --ray-address ADDR --replicas N``: the same FastAPI app on Ray Serve.

Each replica is a Ray actor that opens the dataset, its indexes and the model itself
(``ServedStore.open``) and builds the app with ``create_app``: the routes, the guard, the
batching and the explorer page are those of the single-process server. Ray Serve's proxy
listens on ``--host``/``--port`` and spreads requests over the replicas.

With ``--shard-actors N`` (or ``auto``: one per node), the command first starts, for each
index (a compact index in shards), the ``ShardSearcher`` actors of
``pipeline/lookup/index/ivf_ray.py`` that ``elmo senses search --ray-address`` uses,
each holding some of the shards; every replica is given their handles (a ``RayIvf``) and
sends its searches there (``SenseIndex.search_with``), so a replica opens no shard: the
scatter and the gather are ``RayIvf``'s, the hits one process's. The actors are the
command's: they end with it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.serve.limits import SQL_MEMORY_MB, SQL_TIMEOUT_S

APP_NAME = "elmo-serve"
# Replicas load the model and open the dataset: tens of seconds; past this, the cluster
# lacks the CPUs for them (or a replica keeps failing), and the command says so.
REPLICAS_START_TIMEOUT_S = 300


@dataclass
class ReplicaSettings:
    dataset: str
    indexes: list[str]
    model_dir: str | None = None
    sql_timeout_s: float = SQL_TIMEOUT_S
    token: str | None = None
    # Index name -> the Ray actors holding its shards (``ivf_ray.RayIvf``; --shard-actors).
    searchers: dict[str, Any] = field(default_factory=dict)
    sql_memory_mb: int = SQL_MEMORY_MB  # each replica's /sql worker (sql_worker.py)


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
                                          settings.model_dir, settings.sql_timeout_s,
                                          settings.searchers,
                                          sql_memory_mb=settings.sql_memory_mb)

        def __serve_build_asgi_app__(self) -> Any:
            from pipeline.lookup.serve.app import create_app

            return create_app(self.store, self.settings.token)

    return ElmoReplica


def start_shard_actors(settings: ReplicaSettings, ray_address: str,
                       actors: int | None) -> list[Any]:
    """For each of ``settings``' indexes, ``actors`` ``ShardSearcher`` actors holding its
    shards (None: one per node), recorded in ``settings.searchers`` for the replicas; the
    ``RayIvf`` of each, to ``close`` at the end. An index that is not compact and in
    shards is refused, naming the build that makes one."""
    from pipeline.lookup.index.ivf_ray import start_searchers
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.serve.resources import index_name

    try:
        for spec in settings.indexes:
            name, uri = index_name(spec)
            settings.searchers[name] = start_searchers(SenseIndex(uri), ray_address, actors)
    except BaseException:
        close_all(list(settings.searchers.values()))
        raise
    return list(settings.searchers.values())


def close_all(searchers: list[Any]) -> None:
    for ivf in searchers:
        ivf.close()


def deploy(settings: ReplicaSettings, ray_address: str, replicas: int, host: str,
           port: int, cpus_per_replica: float = 1.0, shard_actors: int | None = None,
           scatter: bool = False) -> list[Any]:
    """Join (or start) Ray, start the shard actors when ``scatter``
    (``start_shard_actors``), run the app with ``replicas`` replicas; returns once they
    all answer, with the shard actors' ``RayIvf``s (to close at the end)."""
    from pipeline.lookup.ray_work import connect

    connect(ray_address)  # an address nothing answers at: one line, within seconds
    from ray import serve

    searchers = start_shard_actors(settings, ray_address, shard_actors) if scatter else []
    try:
        serve.start(http_options={"host": host, "port": port})
        deployment = serve.deployment(
            _replica_class(), name="elmo", num_replicas=replicas,
            ray_actor_options={"num_cpus": cpus_per_replica},
            # One replica at a time takes requests in batches itself: let many wait on it.
            max_ongoing_requests=256)
        _run_and_wait(deployment.bind(settings), replicas, cpus_per_replica)
    except BaseException:
        close_all(searchers)
        raise
    return searchers


def _run_and_wait(app: Any, replicas: int, cpus: float) -> None:
    """``serve.run``, but a deployment whose replicas fail or do not start within
    ``REPLICAS_START_TIMEOUT_S`` is a user error (``serve.run`` waits for ever)."""
    import ray
    from ray import serve
    from ray.serve import api

    run = getattr(api, "_run", None)
    if run is None:  # a Ray without the non-blocking form: wait as serve.run does
        serve.run(app, name=APP_NAME, route_prefix="/")
        return
    run(app, _blocking=False, name=APP_NAME, route_prefix="/")
    deadline = time.monotonic() + REPLICAS_START_TIMEOUT_S
    while True:
        status = serve.status().applications.get(APP_NAME)
        state = str(getattr(status, "status", ""))
        if state.endswith("RUNNING"):
            return
        if state.endswith("DEPLOY_FAILED"):
            message = (getattr(status, "message", "") or "").strip().splitlines()
            serve.shutdown()
            raise ElmoUserError("the server's replicas failed to start: "
                                f"{message[-1] if message else state}")
        if time.monotonic() > deadline:
            free = ray.available_resources().get("CPU", 0)
            serve.shutdown()
            raise ElmoUserError(f"{replicas} replica(s) of {cpus:g} CPU did not start within "
                                f"{REPLICAS_START_TIMEOUT_S} s ({free:g} CPUs free on the "
                                "cluster); pass fewer --replicas or --shard-actors, or add "
                                "nodes")
        time.sleep(0.5)


def wait_until_interrupted(searchers: list[Any] | None = None) -> None:
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
        close_all(searchers or [])
