"""The Ray Data executor: a real local Ray cluster (2 CPUs), a real actor pool."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import assert_same_dataset, config, write_corpus

from pipeline.write.embed import embed_corpus

pytestmark = [
    pytest.mark.slow,
    # Ray Data's own DataContext trips its deprecated-attribute warnings; not ours to fix.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]


def kill_one_item_call(armed: Path, fired: Path) -> Callable[[], None]:
    """A Ray ``worker_process_setup_hook``: once ``armed`` exists, the first item a worker
    process starts kills that process, like an OOM kill or a preempted node; ``fired``
    (created atomically, so only one actor dies) records it. Ray pickles the hook by
    value and runs it in every worker it starts, restarted actors included."""

    def install() -> None:
        from pipeline.write.work_item import ItemWorker

        real = ItemWorker.process

        def process(self: ItemWorker, item: object) -> object:
            if armed.exists():
                try:
                    os.close(os.open(fired, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(self, item)

        ItemWorker.process = process  # type: ignore[method-assign]

    return install


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local Ray cluster whose workers kill themselves once when ``<dir>/armed`` exists
    (``<dir>`` is what the fixture yields; ``<dir>/fired`` appears when one did)."""
    import logging

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    # A short temp dir: Ray's socket paths must stay under the 107-byte AF_UNIX limit.
    temp = tmp_path_factory.mktemp("ray")
    faults = tmp_path_factory.mktemp("faults")
    hook = kill_one_item_call(faults / "armed", faults / "fired")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False, _temp_dir=str(temp),
             runtime_env={"worker_process_setup_hook": hook})
    yield faults
    ray.shutdown()


def test_ray_matches_local_across_actor_counts_and_survives_a_killed_actor(
        ray_cluster: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    local, one, two = tmp_path / "local", tmp_path / "one", tmp_path / "two"
    kw = {"min_items": 3, "batch_tokens": 8}  # small budget: several units per shard
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], local, **kw))
    s1 = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], one, executor="ray", actors=1,
                             **kw))
    assert s1.executor == "ray" and s1.documents == 9
    assert_same_dataset(local, one)

    (ray_cluster / "armed").touch()
    try:
        s2 = embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], two, executor="ray",
                                 actors=2, **kw))
    finally:
        (ray_cluster / "armed").unlink()
    assert (ray_cluster / "fired").exists(), "the fault hook did not fire: no actor was killed"
    assert s2.documents == 9 and s2.tokens == s1.tokens
    # The unit that was in flight when its actor died was retried: nothing lost or doubled.
    assert_same_dataset(one, two)
    tokens = pq.read_table(two / "tokens").to_pandas()
    assert not tokens.duplicated(["doc_id", "sent_idx", "tok_idx"]).any()


def test_a_request_the_cluster_cannot_hold_fails_in_seconds(ray_cluster: Path,
                                                           tiny_model_dir: Path,
                                                           tmp_path: Path) -> None:
    """3 actors of 1 CPU on a 2-CPU cluster: refused before any work, one line naming
    what is missing and what to pass; with --wait-for-resources, after that long."""
    import time

    from elmo_model.errors import ElmoUserError
    from pipeline.write.config import flag_of

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "ds"
    t0 = time.monotonic()
    with pytest.raises(ElmoUserError) as caught:
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, executor="ray", actors=3,
                            cpus_per_actor=1))
    assert time.monotonic() - t0 < 10
    message = str(caught.value)
    assert "\n" not in message and "cannot hold 3 actors of 1 CPU each" in message
    assert "it has 2 CPUs and 0 GPUs on 1 nodes (room for 2)" in message
    assert "pass actors 2" in message and "wait_for_resources_s SECONDS" in message
    as_flags = caught.value.named(flag_of)  # what `elmo embed` prints
    assert "pass --actors 2" in as_flags and "--wait-for-resources SECONDS" in as_flags
    assert not out.exists()

    t0 = time.monotonic()
    with pytest.raises(ElmoUserError, match="after waiting 2 s"):
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, executor="ray", actors=3,
                            cpus_per_actor=1, wait_for_resources_s=2.0))
    assert 2 <= time.monotonic() - t0 < 10
    # A GPU the cluster does not have: the message offers the CPU.
    with pytest.raises(ElmoUserError, match=r"1 CPU \+ 1 GPU each.*pass device cpu") as caught:
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, executor="ray", actors=1,
                            device="cuda"))
    assert "pass --device cpu" in caught.value.named(flag_of)
    assert not out.exists()
    # Placed without a GPU but told to use one: the actor's own SettingError crosses Ray
    # whole, so the CLI still names the flag (not the Python keyword).
    from elmo_model.errors import SettingError

    with pytest.raises(SettingError) as caught:
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], out, executor="ray", actors=1,
                            device="cuda", gpus_per_actor=0.0, cpus_per_actor=1))
    assert caught.value.named(flag_of).endswith("use --device cpu")
    assert not out.exists()


def test_actors_that_fit_counts_per_node() -> None:
    from pipeline.write.ray_setup import actors_that_fit

    nodes = [{"Alive": True, "Resources": {"CPU": 3.0, "GPU": 1.0}},
             {"Alive": True, "Resources": {"CPU": 1.0}},
             {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]
    assert actors_that_fit(nodes, cpus=1, gpus=0) == 4
    assert actors_that_fit(nodes, cpus=2, gpus=0) == 1  # 2 CPUs never span two nodes
    assert actors_that_fit(nodes, cpus=1, gpus=1) == 1
    assert actors_that_fit(nodes, cpus=1, gpus=0.5) == 2
