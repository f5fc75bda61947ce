"""Which executor runs an embedding (``choose_executor``: the one rule for ``elmo embed``,
the Python API and jobs), and the Ray connection and resources the Ray executor needs:
how many actors a cluster holds, the GPUs each asks for, a check before Ray starts, and
one Ray session shared by many runs (a job's changed files).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator

from elmo_model.errors import SettingError
from pipeline.ray_address import require_reachable
from pipeline.write.config import EmbedConfig


def choose_executor(cfg: EmbedConfig) -> str:
    """"local" or "ray": the one rule for ``elmo embed``, the Python API and jobs."""
    if cfg.executor != "auto":
        return cfg.executor
    if cfg.actors > 1 or cfg.ray_address or cfg.gpus_per_actor:
        return "ray"
    if cfg.device == "cpu":
        return "local"  # Ray is only worth starting here to put the model on a GPU
    try:
        import ray

        if ray.is_initialized():
            return "ray"
    except ImportError:
        pass
    import torch

    return "ray" if torch.cuda.is_available() else "local"


def _quiet_ray_env(local: bool) -> None:
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")  # a C++ line per actor otherwise
    if local:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60: token auth by default


def actors_that_fit(nodes: list[dict], cpus: float, gpus: float) -> int:
    """How many actors needing ``cpus`` CPUs and ``gpus`` GPUs each the alive nodes hold."""
    total = 0
    for node in nodes:
        if not node.get("Alive", True):
            continue
        have = node.get("Resources", {})
        fit = math.inf
        if cpus > 0:
            fit = min(fit, math.floor(have.get("CPU", 0) / cpus + 1e-9))
        if gpus > 0:
            fit = min(fit, math.floor(have.get("GPU", 0) / gpus + 1e-9))
        total += 0 if fit == math.inf else int(fit)
    return total


def gpus_per_actor(cfg: EmbedConfig, cluster_gpus: float) -> float:
    """The GPUs each Ray actor requests, on a cluster that has ``cluster_gpus``."""
    if cfg.device == "cpu":
        return 0.0  # a GPU reserved by an actor that computes on the CPU is wasted
    if cfg.gpus_per_actor is not None:
        return cfg.gpus_per_actor
    # --device cuda asks for one even when the cluster has none yet: an autoscaling
    # cluster adds a GPU node for the pending actor (see --wait-for-resources).
    return 1.0 if cfg.device == "cuda" or cluster_gpus >= 1 else 0.0


def cpu_workers_per_actor(cfg: EmbedConfig, nodes: list[dict], gpus: float) -> int:
    """Item worker processes that feed each actor's model (pipeline/write/stages.py).

    ``--cpu-workers`` when given. Else, without a GPU, 0: the model computes on the same
    cores as the reading and writing, and handing layers to other processes only adds
    copies (BENCHMARKS.md, "All of a node's cores feed its GPUs"); each actor works its
    own items as before. With GPUs, every core of a GPU node but the one that drives each
    model: ``cores / actors on the node - 1`` per actor, at least 1, on the GPU node
    with the fewest (so every actor's workers fit next to it). An autoscaling cluster
    whose GPU nodes are not up yet has no node to count: 0 then (each actor works its own
    items, as without a GPU); give ``--cpu-workers`` (ray_cluster.yaml's job spec does).
    """
    if cfg.cpu_workers is not None:
        return cfg.cpu_workers
    if not gpus:
        return 0
    per_actor = []
    for node in nodes:
        have = node.get("Resources", {})
        if node.get("Alive", True) and have.get("GPU", 0) >= gpus:
            actors_here = math.floor(have["GPU"] / gpus + 1e-9)
            per_actor.append(max(1, int(have.get("CPU", 0) // actors_here) - 1))
    return min(per_actor, default=0)


def _preflight_local(cfg: EmbedConfig) -> None:
    """A Ray started here has this machine's GPUs: refuse a GPU request it cannot serve
    before paying for Ray's start-up."""
    wanted = gpus_per_actor(cfg, 0.0)
    if not wanted:
        return
    import torch

    have = torch.cuda.device_count()
    if math.floor(have / wanted + 1e-9) < cfg.actors:
        def render(name: Callable[[str], str]) -> str:
            asked = (f"{name('device')} cuda" if cfg.gpus_per_actor is None
                     else f"{name('gpus_per_actor')} {wanted:g}")
            return (f"{name('actors')} {cfg.actors} with {asked} need "
                    f"{wanted * cfg.actors:g} GPUs; this machine has {have}: pass "
                    f"{name('device')} cpu (or auto), fewer {name('actors')}, or "
                    f"{name('ray_address')} of a cluster with GPUs")

        raise SettingError("actors", render)


def connect_ray(cfg: EmbedConfig) -> bool:
    """Connect to (or start) the Ray that ``cfg`` asks for unless one is connected
    already; True when this call did, so the caller shuts it down."""
    local = not cfg.ray_address
    _quiet_ray_env(local)
    import ray

    if ray.is_initialized():
        return False
    if local:
        _preflight_local(cfg)
    else:
        require_reachable(cfg.ray_address, "start one (`ray start --head`), or leave out "
                          "--ray-address to run on a Ray of this machine")
    ray.init(address=cfg.ray_address, logging_level=logging.WARNING, log_to_driver=False,
             include_dashboard=False)
    return True


@contextlib.contextmanager
def ray_session(cfg: EmbedConfig) -> Iterator[None]:
    """One Ray connection around many runs like ``cfg`` (a job's changed files): each run
    finds Ray connected and reuses it instead of starting and stopping its own (seconds
    per run). Nothing happens when ``cfg`` would run in-process."""
    started = choose_executor(cfg) == "ray" and connect_ray(cfg)
    try:
        yield
    finally:
        if started:
            import ray

            ray.shutdown()
