"""Ray for the sense index: joining a cluster without hanging (``connect``), and a compact
index's per-shard build work run as Ray tasks (``ShardTasks``).

A refresh (``jobs/index_refresh.py``) or build of a compact index does two kinds of work a
shard at a time (``ivf_shards_build.build_shards``): a new dataset file's rows are mixed on
read and written as the shard's vectors, and a shard's vectors are encoded with the
training (codes, lists, sketches). ``build_shards`` hands each such piece to a runner: in
this process one after the other (``shard_work.run_here``), or on a Ray cluster one task
each (``ShardTasks``), which write the same files: the shards' folders are the same bytes
either way. The training and the probes measurement stay in the calling process (one
sample, one scan). Tasks write into the index's ``_ivf`` folder, so on a cluster of many
machines the index must be on storage every node sees at the same path (a shared file
system); an index on an object store is built through a local folder, so its per-shard
work stays in the calling process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.shard_work import ShardJob
from pipeline.ray_address import require_reachable

TASK_CPUS = 1.0


def connect(address: str) -> None:
    """``ray.init`` quietly: ``local`` starts a Ray in this process, else joins
    ``address``; a cluster that is not there is a user error naming the fix, said within
    seconds (``ray.init`` alone waits minutes on an address nothing answers)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    if address == "local":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60: token auth by default
        ray.init(logging_level=logging.WARNING, log_to_driver=False, include_dashboard=False)
        return
    fix = "start one (`ray start --head`), or pass --ray-address local"
    require_reachable(address, fix)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ElmoUserError(f"no Ray cluster at {address} ({error}); {fix}") from None


class ShardTasks:
    """A runner for ``build_shards``: each piece of per-shard work one Ray task of
    ``TASK_CPUS`` CPU on the cluster at ``address``, joined on the first work (a refresh
    with nothing to encode never starts Ray) unless Ray is already; ``close`` leaves a Ray
    it joined."""

    def __init__(self, address: str) -> None:
        self.address, self.joined = address, False
        self.nodes: set[str] = set()  # where the tasks ran

    def _join(self) -> None:
        import ray

        if not ray.is_initialized():
            connect(self.address)
            self.joined = True
        if ray.cluster_resources().get("CPU", 0) < TASK_CPUS:
            raise ElmoUserError(f"the Ray cluster at {self.address} has no CPU for the "
                                "index's shard tasks; add a node with CPUs, or run without "
                                "a Ray address")

    def __call__(self, jobs: Sequence[ShardJob], on_rows: Callable[[int], Any]) -> None:
        if not jobs:
            return
        self._join()
        import ray

        # SPREAD: the shards' work goes to every node, not first to the one asking.
        task = ray.remote(num_cpus=TASK_CPUS, max_retries=0,
                          scheduling_strategy="SPREAD")(_run_job)
        pending = {task.remote(call): rows for rows, call in jobs}
        while pending:
            # No time limit: a shard's encoding takes as long as its rows do; a cluster
            # with no CPU at all was refused when joined.
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                try:
                    self.nodes.add(ray.get(ref))
                except ray.exceptions.RayTaskError as error:
                    for other in pending:
                        ray.cancel(other, force=True)
                    cause = getattr(error, "cause", None)
                    raise (cause if isinstance(cause, Exception) else error) from None
                on_rows(pending.pop(ref))

    def close(self) -> None:
        import ray

        if self.joined and ray.is_initialized():
            ray.shutdown()
            self.joined = False


def _run_job(call: Callable[[Callable[[int], Any]], None]) -> str:
    """One piece of per-shard work in a Ray worker (progress is told by the caller when
    the task ends); the node it ran on."""
    import ray

    call(lambda rows: None)
    return ray.get_runtime_context().get_node_id()
