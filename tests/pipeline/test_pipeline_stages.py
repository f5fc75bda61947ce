"""Stage processes (pipeline/write/stages.py) on a real local Ray: a model actor fed by item
worker processes writes the same bytes as the local executor and as actors that work
their own items, and a killed model worker costs a retry, not a row."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import config, dataset_files, write_corpus

from pipeline.write.embed import embed_corpus

pytestmark = pytest.mark.slow


def fault_and_device_hooks(faults: Path) -> Callable[[], None]:
    """A Ray ``worker_process_setup_hook``: once ``faults/armed`` exists, the first model
    call kills its model actor's process (an OOM kill, a lost GPU; ``faults/fired``
    records it); while ``faults/broken`` exists, a restarted model actor cannot load its
    model; while ``faults/on_device`` exists, the model quantizes int8 layers itself and
    sends them to the item workers, as on a GPU."""
    armed, fired, on_device = faults / "armed", faults / "fired", faults / "on_device"
    broken = faults / "broken"  # a restarted model actor cannot load its model

    def install() -> None:
        from pipeline.write import stages, work_item
        from pipeline.write.stages import ModelActor

        real_rule = work_item.quantizes_on_device

        def quantizes_on_device(embedder: object, dtype: str) -> bool:
            if dtype == "int8" and on_device.exists():
                (faults / "quantized_on_device").touch()
                return True
            return real_rule(embedder, dtype)

        stages.quantizes_on_device = quantizes_on_device  # type: ignore[assignment]

        real = ModelActor.embed

        def embed(self: ModelActor, sentences: list[list[str]]) -> object:
            if armed.exists():
                try:
                    os.close(os.open(fired, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(self, sentences)

        ModelActor.embed = embed  # type: ignore[method-assign]
        real_load = ModelActor._load

        def load(self: ModelActor) -> None:
            import ray

            from elmo_model.errors import ElmoUserError

            if broken.exists() and ray.get_runtime_context().was_current_actor_reconstructed:
                raise ElmoUserError("the GPU fell off the bus; check nvidia-smi")
            real_load(self)

        ModelActor._load = load  # type: ignore[method-assign]

    return install


@pytest.fixture(scope="module")
def ray_two_cpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    import logging

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    temp = tmp_path_factory.mktemp("ray")  # short: AF_UNIX paths stay under 107 bytes
    faults = tmp_path_factory.mktemp("faults")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False, _temp_dir=str(temp),
             runtime_env={"worker_process_setup_hook": fault_and_device_hooks(faults)})
    yield faults
    ray.shutdown()


RUNS = {  # executor settings -> what runs where
    "local": {},  # in-process, two items on threads
    "ray": {"executor": "ray", "cpus_per_actor": 1, "cpu_workers": 0},  # actor does all
    "stages": {"executor": "ray", "cpus_per_actor": 1, "cpu_workers": 1},  # model + worker
}


@pytest.mark.parametrize("dtype", ["int8", "float16"])
def test_every_executor_writes_the_same_bytes(ray_two_cpus: Path, tiny_model_dir: Path,
                                              tmp_path: Path, one_torch_thread: None,
                                              dtype: str) -> None:
    """Byte-equal tables (one torch thread everywhere, as a Ray actor of 1 CPU has)."""
    corpus = write_corpus(tmp_path / "corpus")
    kw = {"min_items": 3, "batch_tokens": 8, "dtype": dtype}  # several units per item
    for name, extra in RUNS.items():
        summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / name,
                                      **kw, **extra))
        assert summary.documents == 9 and summary.executor == (extra.get("executor")
                                                               or "local")
    runs = list(RUNS)
    if dtype == "int8":  # and the GPU's path: int8 from the model, through Ray's store
        (ray_two_cpus / "on_device").touch()
        try:
            embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / "on_device",
                                **kw, **RUNS["stages"]))
        finally:
            (ray_two_cpus / "on_device").unlink()
        assert (ray_two_cpus / "quantized_on_device").exists(), "the model did not quantize"
        runs.append("on_device")
    tables = {name: dataset_files(tmp_path / name) for name in runs}
    assert tables["local"] and any("tokens" in key for key in tables["local"])
    for name in runs[1:]:
        assert tables[name].keys() == tables["local"].keys()
        for key, table in tables["local"].items():
            assert tables[name][key].equals(table), (name, key)
            assert (tmp_path / name / key).read_bytes() == (tmp_path / "local" / key
                                                            ).read_bytes(), (name, key)


def test_a_killed_model_worker_costs_a_retry_not_a_row(ray_two_cpus: Path,
                                                      tiny_model_dir: Path,
                                                      tmp_path: Path,
                                                      one_torch_thread: None) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    kw = {"min_items": 3, "batch_tokens": 8, **RUNS["stages"]}
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / "clean", **kw))
    (ray_two_cpus / "armed").touch()
    try:
        summary = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / "killed",
                                      **kw))
    finally:
        (ray_two_cpus / "armed").unlink()
    assert (ray_two_cpus / "fired").exists(), "the fault hook did not fire"
    assert summary.documents == 9
    clean, killed = dataset_files(tmp_path / "clean"), dataset_files(tmp_path / "killed")
    assert clean.keys() == killed.keys()
    for key, table in clean.items():
        assert killed[key].equals(table), key
    tokens = pq.read_table(tmp_path / "killed" / "tokens").to_pandas()
    assert not tokens.duplicated(["doc_id", "sent_idx", "tok_idx"]).any()


def test_cpu_workers_default_from_the_gpu_nodes_cores(tiny_model_dir: Path) -> None:
    from pipeline.write.ray_setup import cpu_workers_per_actor

    gpu_node = {"Alive": True, "Resources": {"CPU": 16.0, "GPU": 1.0}}
    eight = {"Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}}
    cpu_node = {"Alive": True, "Resources": {"CPU": 2.0}}
    cfg = config(tiny_model_dir, ["x"], "out")
    assert cpu_workers_per_actor(cfg, [cpu_node], gpus=0) == 0  # CPU only: as before
    assert cpu_workers_per_actor(cfg, [gpu_node, cpu_node], gpus=1) == 15
    assert cpu_workers_per_actor(cfg, [gpu_node, eight], gpus=1) == 7  # the tightest node
    assert cpu_workers_per_actor(cfg, [gpu_node], gpus=0.125) == 1  # 8 actors, 2 cores each
    assert cpu_workers_per_actor(cfg, [cpu_node], gpus=1) == 0  # GPU nodes not up yet
    given = config(tiny_model_dir, ["x"], "out", cpu_workers=3)
    assert cpu_workers_per_actor(given, [gpu_node], gpus=1) == 3


def test_a_model_worker_that_cannot_come_back_stops_the_run_in_one_line(
        ray_two_cpus: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Fail fast, not hang: the model actor dies mid-run and its restart cannot load the
    model; the run stops with that reason, in one line, within seconds."""
    import time

    from elmo_model.errors import ElmoUserError

    corpus = write_corpus(tmp_path / "corpus")
    (ray_two_cpus / "fired").unlink(missing_ok=True)
    (ray_two_cpus / "broken").touch()
    (ray_two_cpus / "armed").touch()
    began = time.monotonic()
    try:
        with pytest.raises(ElmoUserError) as caught:
            embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / "ds",
                                min_items=3, batch_tokens=8, **RUNS["stages"]))
    finally:
        (ray_two_cpus / "armed").unlink()
        (ray_two_cpus / "broken").unlink()
    assert (ray_two_cpus / "fired").exists(), "the fault hook did not fire"
    assert str(caught.value) == "the GPU fell off the bus; check nvidia-smi"
    assert time.monotonic() - began < 120
