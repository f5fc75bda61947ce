"""Stage 3: where items run. Both executors take items from the plan lazily and yield
``(item, CommitRecord)`` pairs as items finish, in any order; the driver commits them.

- ``LocalExecutor``: the item worker in this process (laptops), two items at a time.
- ``RayExecutor``: ``--actors`` models on Ray actors. Each model either works its own
  items, two at a time (the model under a lock, so one item's read/tokenize/write
  overlaps the other's model time: the default without a GPU), or feeds ``--cpu-workers``
  item worker processes on its node, which read, tokenize and write while the model
  computes (pipeline/write/stages.py: the default with a GPU, one worker per spare core). At
  most ``IN_FLIGHT_PER_ACTOR`` items per item-taking actor are submitted: the driver
  never holds more than that many items, whatever the corpus size. A dead actor (killed
  process, removed node) is restarted by Ray, on another node if need be; its items run
  again elsewhere, and since a worker only writes to a private staging prefix, an
  attempt that never reported back is never committed.

Progress: while items run, both executors pass ``on_progress`` the stored tokens done so
far of each running item (``ItemProgress``, updated per model unit), every
``PROGRESS_POLL_S`` at most, so the driver's bar moves before the first item commits.

Before any work ``RayExecutor.start`` checks that the cluster can hold the requested
actors at all (one line naming what is missing and what to pass instead) and that
every actor can load the model, so a bad request fails in seconds, before the output
is touched.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from elmo_model import select_device
from elmo_model.errors import ElmoUserError, SettingError
from pipeline.write.config import EmbedConfig
from pipeline.write.plan import WorkItem
from pipeline.write.process_memory import fix_mmap_threshold
from pipeline.write.ray_setup import (
    actors_that_fit,
    choose_executor,
    connect_ray,
    cpu_workers_per_actor,
    gpus_per_actor,
)
from pipeline.write.stages import MODEL_CALLS_AT_ONCE, ItemStageActor, ModelActor, model_problem
from pipeline.write.work_item import CommitRecord, ItemSettings, ItemWorker

IN_FLIGHT_PER_ACTOR = 2
MAX_ATTEMPTS = 4  # an item that kills its worker this often stops the run
READY_GRACE_S = 300.0  # for an actor to start and load its model once placed
POLL_S = 1.0
PROGRESS_POLL_S = 0.5  # how often the driver asks workers how far their items are

# Item index -> stored tokens done so far, for the items a worker is running.
ProgressCallback = Callable[[dict[int, int]], None]


class LocalExecutor:
    """The item worker in this process, ``in_flight`` items at a time on threads: the
    model runs under the worker's lock, so one item's reading, tokenizing and writing
    overlap the other's model time (torch releases the GIL in its kernels)."""

    name = "local"

    def __init__(self, settings: ItemSettings, in_flight: int = IN_FLIGHT_PER_ACTOR,
                 gpu_sizes: tuple[int, int] | None = None) -> None:
        self.worker = ItemWorker(settings)
        self.in_flight = in_flight
        self.gpu_sizes = gpu_sizes  # (batch, unit) tokens when the model lands on a GPU
        self._torch_threads: int | None = None  # torch's threads before start set them

    def start(self) -> None:
        fix_mmap_threshold()
        settings = self.worker.settings
        if self.gpu_sizes and select_device(settings.device).type == "cuda":
            self.worker = ItemWorker(with_model_call_sizes(settings, self.gpu_sizes))
        else:
            self._torch_threads = torch.get_num_threads()
            torch.set_num_threads(local_model_threads(self.in_flight))
        self.worker.load()

    def run(self, items: Iterator[WorkItem], on_progress: ProgressCallback | None = None
            ) -> Iterator[tuple[WorkItem, CommitRecord]]:
        with concurrent.futures.ThreadPoolExecutor(self.in_flight) as pool:
            running: collections.deque = collections.deque()
            for item in items:
                running.append((item, pool.submit(self.worker.process, item)))
                if len(running) >= self.in_flight:
                    done, future = running.popleft()
                    yield done, self._result(future, on_progress)
            while running:
                done, future = running.popleft()
                yield done, self._result(future, on_progress)

    def _result(self, future: concurrent.futures.Future, on_progress: ProgressCallback | None
                ) -> CommitRecord:
        """The item's record, reporting the running items' progress while it is made."""
        if on_progress is not None:
            while not concurrent.futures.wait([future], timeout=PROGRESS_POLL_S).done:
                on_progress(self.worker.progress.snapshot())
        return future.result()

    def close(self) -> None:
        self.worker = None  # type: ignore[assignment]
        if self._torch_threads is not None:  # this process's setting, as it was
            torch.set_num_threads(self._torch_threads)
            self._torch_threads = None


def local_model_threads(in_flight: int) -> int:
    """torch's threads for the local executor's CPU model: the cores this process may use
    less one per other item in flight, which reads, tokenizes and writes on a core of its
    own meanwhile. torch's default (every core) splits the model's larger ops over a core
    that item wants: on 2 cores at 3 x 1024, ~25 us more CPU a token for no gain in wall
    time (BENCHMARKS.md, "The model stage's buffers, layer 0 per type, one model
    thread"). The stored bytes do not depend on the thread count (docs/dataset_format.md,
    "Same vectors whatever the batch")."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) - (in_flight - 1))


class ItemActor:
    """A Ray actor around one ``ItemWorker``, created with a thread per item in flight and
    one more, so ``progress`` answers while items run."""

    def __init__(self, settings: ItemSettings, threads: int) -> None:
        fix_mmap_threshold()
        import ray
        import torch

        torch.set_num_threads(max(1, threads))
        self.worker = ItemWorker(settings)
        self.worker.node_id = ray.get_runtime_context().get_node_id()

    def ready(self) -> ElmoUserError | None:
        """None once the model is loaded; else the reason it cannot be."""
        return model_problem(self.worker.load)

    def process(self, item: WorkItem) -> CommitRecord:
        return self.worker.process(item)

    def progress(self) -> dict[int, int]:
        """Stored tokens done so far of the items running here (answers while they run:
        the actor has a thread beyond its items' for this)."""
        return self.worker.progress.snapshot()


class RayExecutor:
    name = "ray"

    def __init__(self, cfg: EmbedConfig, settings: ItemSettings) -> None:
        self.cfg, self.settings = cfg, settings
        self.actors: list[Any] = []  # what the driver gives items to
        self.model_actors: list[Any] = []  # with item workers: the models they feed
        self.started_ray = False
        self.cpus = 1.0  # per model actor
        self.gpus = 0.0
        self.workers = 0  # item worker processes per model actor (0: it works its items)

    # ---------------------------------------------------------------- start

    def start(self) -> None:
        cfg = self.cfg
        self.started_ray = connect_ray(cfg)
        import ray

        resources = ray.cluster_resources()
        self.gpus = gpus_per_actor(cfg, resources.get("GPU", 0))
        self.workers = cpu_workers_per_actor(cfg, ray.nodes(), self.gpus)
        if cfg.cpus_per_actor is not None:
            self.cpus = cfg.cpus_per_actor
        elif self.gpus:
            self.cpus = 1.0
        else:  # the node's share of each actor, less its item workers' CPUs
            share = int(resources.get("CPU", 1) // cfg.actors)
            self.cpus = max(1.0, float(share - self.workers))
        self._wait_for_capacity()
        if self.gpus:
            self.settings = with_model_call_sizes(self.settings, cfg.model_call_sizes(True))
        model_threads = max(1, int(self.cpus))
        if not self.workers:
            remote_cls = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=-1,
                                    max_task_retries=0,
                                    max_concurrency=IN_FLIGHT_PER_ACTOR + 1)(ItemActor)
            self.actors = [remote_cls.remote(self.settings, model_threads)
                           for _ in range(cfg.actors)]
            self._wait_ready(self.actors)
            return
        model_cls = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_restarts=-1,
                               max_task_retries=0,
                               max_concurrency=MODEL_CALLS_AT_ONCE)(ModelActor)
        self.model_actors = [model_cls.remote(self.settings, model_threads)
                             for _ in range(cfg.actors)]
        self._wait_ready(self.model_actors)
        self._start_item_workers()

    def _start_item_workers(self) -> None:
        """``self.workers`` item worker processes per model actor, on its node when it has
        room (their layers then come through the node's shared memory)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = ray.get([model.node.remote() for model in self.model_actors])
        item_cls = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0,
                              max_concurrency=IN_FLIGHT_PER_ACTOR + 1)(ItemStageActor)
        self.actors = [
            item_cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True)
                             ).remote(self.settings, model)
            for model, node in zip(self.model_actors, nodes, strict=True)
            for _ in range(self.workers)]
        self._wait_ready(self.actors)

    def _need(self) -> str:
        parts = [f"{self.cpus + self.workers:g} CPU"]
        if self.gpus:
            parts.append(f"{self.gpus:g} GPU")
        return " + ".join(parts)

    def _wait_for_capacity(self) -> None:
        import ray

        cfg = self.cfg
        deadline = time.monotonic() + cfg.wait_for_resources_s
        asked = False
        while True:
            nodes = ray.nodes()
            fits = actors_that_fit(nodes, self.cpus + self.workers, self.gpus)
            if fits >= cfg.actors:
                return
            if time.monotonic() >= deadline:
                break
            if not asked:  # an autoscaler adds nodes for explicit requests too
                try:
                    from ray.autoscaler.sdk import request_resources

                    bundle = {"CPU": self.cpus + self.workers,
                              **({"GPU": self.gpus} if self.gpus else {})}
                    request_resources(bundles=[bundle] * cfg.actors)
                except Exception:  # no autoscaler here: just wait and look again
                    pass
                asked = True
            time.sleep(POLL_S)
        alive = [n for n in nodes if n.get("Alive", True)]
        have_cpu = sum(n.get("Resources", {}).get("CPU", 0) for n in alive)
        have_gpu = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
        waited = (f" after waiting {cfg.wait_for_resources_s:g} s"
                  if cfg.wait_for_resources_s else "")
        need, gpus, workers = self._need(), self.gpus, self.workers
        smaller_cpus = self.cpus > 1 and bool(cfg.cpus_per_actor)

        def render(name: Callable[[str], str]) -> str:
            fixes = [f"{name('actors')} {fits}"] if fits else []
            if gpus:
                fixes.append(f"{name('device')} cpu")
            elif smaller_cpus:
                fixes.append(f"a smaller {name('cpus_per_actor')}")
            if workers:
                fixes.append(f"fewer {name('cpu_workers')}")
            fixes.append(f"{name('wait_for_resources_s')} SECONDS if the cluster autoscales")
            return (f"the Ray cluster cannot hold {cfg.actors} actors of {need} each{waited}: "
                    f"it has {have_cpu:g} CPUs and {have_gpu:g} GPUs on {len(alive)} nodes "
                    f"(room for {fits}); pass {', or '.join(fixes)}")

        raise SettingError("actors", render)

    def _wait_ready(self, actors: list[Any]) -> None:
        import ray

        refs = [actor.ready.remote() for actor in actors]
        timeout = self.cfg.wait_for_resources_s + READY_GRACE_S
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            raise ElmoUserError(f"{len(pending)} of {len(refs)} Ray actors did not start "
                                f"within {timeout:g} s (is the cluster busy?); try again, "
                                "or pass a larger --wait-for-resources")
        for ref in done:
            try:
                problem = ray.get(ref)
            except ray.exceptions.RayError as error:
                raise ElmoUserError(f"a Ray actor failed to start: "
                                    f"{str(error).strip().splitlines()[-1][:300]}") from None
            if problem:
                raise problem

    # ---------------------------------------------------------------- run

    def run(self, items: Iterator[WorkItem], on_progress: ProgressCallback | None = None
            ) -> Iterator[tuple[WorkItem, CommitRecord]]:
        import ray
        from ray.exceptions import RayActorError, RayError, RayTaskError

        todo = iter(items)
        retry: collections.deque[WorkItem] = collections.deque()
        attempts: collections.Counter[int] = collections.Counter()
        in_flight: dict[Any, tuple[WorkItem, int]] = {}
        load = [0] * len(self.actors)
        probing: dict[Any, int] = {}  # ready() call -> actor index, after a failure
        polls: dict[Any, int] = {}  # progress() call -> actor index
        exhausted = False

        def next_item() -> WorkItem | None:
            nonlocal exhausted
            if retry:
                return retry.popleft()
            if exhausted:
                return None
            item = next(todo, None)
            exhausted = item is None
            return item

        def failed(item: WorkItem, reason: str) -> None:
            attempts[item.index] += 1
            if attempts[item.index] >= MAX_ATTEMPTS:
                raise RuntimeError(f"item {item.index} ({item.where()}) failed "
                                   f"{MAX_ATTEMPTS} times; last: {reason}")
            retry.append(item)

        while True:
            down = set(probing.values())
            for a in sorted(range(len(self.actors)), key=lambda k: load[k]):
                while a not in down and load[a] < IN_FLIGHT_PER_ACTOR:
                    item = next_item()
                    if item is None:
                        break
                    in_flight[self.actors[a].process.remote(item)] = (item, a)
                    load[a] += 1
            if not in_flight and exhausted and not retry:
                return
            waiting = list(in_flight) + list(probing)
            # Only when every actor is down can nothing move: then wait a bounded time.
            limit = None if in_flight else self.cfg.wait_for_resources_s + READY_GRACE_S
            busy = [a for a in range(len(self.actors)) if load[a] and a not in down]
            ready = self._wait_any(waiting, limit, busy, polls, on_progress)
            if not ready:
                raise ElmoUserError(f"no Ray actor came back within {limit:g} s after losing "
                                    "workers (nodes gone?); run the same command again to "
                                    "finish the remaining items")
            ref = ready[0]
            if ref in probing:
                a = probing.pop(ref)
                try:
                    problem = ray.get(ref)
                except RayError:
                    time.sleep(POLL_S)  # still restarting: ask again
                    probing[self.actors[a].ready.remote()] = a
                    continue
                if problem:
                    raise problem
                continue
            item, a = in_flight.pop(ref)
            load[a] -= 1
            try:
                record = ray.get(ref)
            except RayTaskError as error:
                cause = getattr(error, "cause", None)
                if isinstance(cause, ElmoUserError):
                    raise ElmoUserError(str(cause)) from None
                failed(item, str(cause or error).strip().splitlines()[-1][:300])
                if isinstance(cause, RayError) and a not in probing.values():
                    # the model actor this item worker feeds on died: wait until it is back
                    probing[self.actors[a].ready.remote()] = a
                continue
            except (RayActorError, RayError) as error:  # the actor or its node died
                failed(item, type(error).__name__)
                if a not in probing.values():
                    probing[self.actors[a].ready.remote()] = a
                continue
            yield item, record

    def _wait_any(self, waiting: list[Any], limit: float | None, busy: list[int],
                  polls: dict[Any, int], on_progress: ProgressCallback | None) -> list[Any]:
        """The first of ``waiting`` to finish ([] after ``limit`` seconds; None: no limit),
        asking the ``busy`` actors how far their items are meanwhile."""
        import ray

        deadline = None if limit is None else time.monotonic() + limit
        while True:
            timeout = PROGRESS_POLL_S if on_progress else None
            if deadline is not None:
                timeout = max(0.0, min(timeout or math.inf, deadline - time.monotonic()))
            ready, _ = ray.wait(waiting, num_returns=1, timeout=timeout)
            if on_progress is not None:
                self._poll_progress(polls, busy, on_progress)
            if ready or (deadline is not None and time.monotonic() >= deadline):
                return ready

    def _poll_progress(self, polls: dict[Any, int], busy: list[int],
                       on_progress: ProgressCallback) -> None:
        """Hand ``on_progress`` what the finished ``progress`` calls returned, and ask each
        busy actor again once its last call has answered (never waits)."""
        import ray
        from ray.exceptions import RayError

        if polls:
            answered, _ = ray.wait(list(polls), num_returns=len(polls), timeout=0)
            for ref in answered:
                polls.pop(ref)
                try:
                    snapshot = ray.get(ref)
                except RayError:  # the actor died: its items run again and report anew
                    continue
                on_progress(snapshot)
        asking = set(polls.values())
        for a in busy:
            if a not in asking:
                polls[self.actors[a].progress.remote()] = a

    def close(self) -> None:
        import ray

        for actor in self.actors + self.model_actors:
            with contextlib.suppress(Exception):  # already gone with its node
                ray.kill(actor)
        self.actors, self.model_actors = [], []
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def with_model_call_sizes(settings: ItemSettings, sizes: tuple[int, int]) -> ItemSettings:
    return dataclasses.replace(settings, batch_tokens=sizes[0], unit_tokens=sizes[1])


def make_executor(cfg: EmbedConfig, settings: ItemSettings) -> LocalExecutor | RayExecutor:
    if choose_executor(cfg) == "ray":
        return RayExecutor(cfg, settings)
    return LocalExecutor(settings, gpu_sizes=None if cfg.device == "cpu" else
                         cfg.model_call_sizes(on_gpu=True))
