"""Stage processes around one model: a model worker keeps its GPU busy while item
workers, other processes on the same node, read and tokenize ahead and write behind.

    driver --items--> ItemStageActor x W   (1 CPU each: read, tokenize, Arrow, Parquet,
                        |    ^              checksums; one item at a time per thread)
          token lists   |    |  int8 layers, through the node's shared-memory object store
                        v    |
                      ModelActor           (the GPU, and 1 CPU to drive it)

The item workers are ``ItemWorker``s whose model stage is ``RemoteModel``: the same code
as in-process, so an item's bytes do not depend on where its model ran. Memory stays
flat because every queue is bounded: the driver gives each item worker at most
``IN_FLIGHT_PER_ACTOR`` items, an item asks for at most ``RemoteModel.lookahead`` + 1
units at a time, so the model worker holds at most that many calls per item in its queue.

On a GPU the layers cross as int8 quantized on the device (a quarter of float32's bytes);
on the CPU, where the stages are not the default (BENCHMARKS.md, "All of a node's cores
feed its GPUs"), as float32 for the item worker's writer to quantize.

Failures: a dead item worker's items run again elsewhere (the driver, as for any actor);
a dead model worker fails the calls in flight, so the items waiting on it fail, and the
driver asks their workers to wait for the model to be back (``ItemStageActor.ready``)
before giving them items again; a model that cannot come back stops the run with its
reason. Nothing hangs on a dead process: Ray fails a call to a dead actor instead of
waiting for it, and when every worker waits, the driver's wait is bounded.
"""

from __future__ import annotations

import threading
from typing import Any

from elmo_model.errors import ElmoUserError
from pipeline.write.plan import WorkItem
from pipeline.write.work_item import (
    CommitRecord,
    ItemSettings,
    ItemWorker,
    load_embedder,
    quantizes_on_device,
)

MODEL_CALLS_AT_ONCE = 3  # one computing, the others copying out or waiting their turn


def model_problem(load: Any) -> ElmoUserError | None:
    """None once ``load()`` has run; else why it failed, as an error the driver raises: a
    ``SettingError`` crosses Ray whole, so the CLI still names its flag."""
    try:
        load()
    except ElmoUserError as error:
        return error
    except Exception as error:  # e.g. a torch error on a broken device
        return ElmoUserError(f"{type(error).__name__}: {error}")
    return None


class ModelActor:
    """The model of one GPU (or GPU share), serving the item workers of its node: one call
    computes at a time (the lock), while earlier calls' layers finish their copies to
    the host and go back (``MODEL_CALLS_AT_ONCE`` threads)."""

    def __init__(self, settings: ItemSettings, threads: int) -> None:
        import torch

        from pipeline.write.process_memory import fix_mmap_threshold

        fix_mmap_threshold()
        torch.set_num_threads(max(1, threads))
        self.settings = settings
        self.embedder: Any = None
        self.lock = threading.Lock()

    def _load(self) -> None:
        with self.lock:
            if self.embedder is None:
                s = self.settings
                self.embedder = load_embedder(s.model, s.batch_tokens, s.compute_dtype,
                                              s.device)

    def ready(self) -> ElmoUserError | None:
        """None once the model is loaded; else the reason it cannot be."""
        return model_problem(self._load)

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def embed(self, sentences: list[list[str]]) -> Any:
        """A unit's layers: ``Int8Layers`` quantized here (on a GPU), else float arrays."""
        self._load()
        with self.lock:
            if not quantizes_on_device(self.embedder, self.settings.dtype):
                return self.embedder.embed(sentences)
            pending = self.embedder.submit_int8(sentences, layer_0_per_type=True)
        return pending.result()  # waits for the copies with the lock free


class RemoteModel:
    """An item worker's model stage when the model is a ``ModelActor``: one unit asked
    ahead of the one being written, so the model computes while this process writes."""

    lookahead = 1

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def submit(self, sentences: list[list[str]]) -> Any:
        return self.actor.embed.remote(sentences)

    def collect(self, ref: Any) -> Any:
        import ray
        from ray.exceptions import RayTaskError

        try:
            return ray.get(ref)
        except RayTaskError as error:  # the user's one line, not the model actor's traceback
            cause = getattr(error, "cause", None)
            if isinstance(cause, ElmoUserError):
                raise ElmoUserError(str(cause)) from None
            raise


class ItemStageActor:
    """An item worker process fed by a ``ModelActor``: reads, tokenizes and writes the
    items the driver gives it, asking the model actor for their layers."""

    def __init__(self, settings: ItemSettings, model_actor: Any) -> None:
        import ray
        import torch

        from pipeline.write.process_memory import fix_mmap_threshold

        fix_mmap_threshold()
        torch.set_num_threads(1)  # no model here: torch only moves bytes
        self.model_actor = model_actor
        self.worker = ItemWorker(settings, RemoteModel(model_actor))
        self.worker.node_id = ray.get_runtime_context().get_node_id()

    def ready(self) -> ElmoUserError | None:
        """None once this worker and its model actor can work; else why not."""
        import ray

        problem = model_problem(self.worker.load)
        return problem or ray.get(self.model_actor.ready.remote())

    def process(self, item: WorkItem) -> CommitRecord:
        return self.worker.process(item)

    def progress(self) -> dict[int, int]:
        return self.worker.progress.snapshot()
