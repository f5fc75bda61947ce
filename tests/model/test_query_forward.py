"""A query's forward pass (a sentence or a few: the server's and the CLI's search) runs on
one torch thread (``onednn.ONE_THREAD_MAX_TOKENS``); its vectors are those the same
sentence gets in a large call at the process's thread count, bit for bit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_model.embedder import WARM_UP_TEXT
from elmo_model.steps.onednn import ONE_THREAD_MAX_TOKENS, threads_for_call


@pytest.fixture
def two_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _sentences(n: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    words = " ".join(WARM_UP_TEXT).split()
    return [[words[i] for i in rng.integers(0, len(words), length)]
            for length in rng.integers(3, 40, n)]


def _assert_query_equals_large_call(embedder: object) -> None:
    queries = _sentences(6, seed=1)
    filler = _sentences(40, seed=2)
    assert sum(len(s) + 2 for s in filler) > ONE_THREAD_MAX_TOKENS  # two threads there
    in_large_call = embedder.embed(queries + filler)[:len(queries)]  # type: ignore[attr-defined]
    for query, want in zip(queries, in_large_call, strict=True):
        got = embedder.embed([query])[0]  # type: ignore[attr-defined]
        assert torch.get_num_threads() == 2  # restored after the call
        assert got.dtype == np.float32 and np.array_equal(got, want)


@pytest.mark.slow
def test_default_model_query_equals_its_rows_in_a_large_call(two_torch_threads: None) -> None:
    from elmo_model.api import default_model_dir, load_model_dir

    _assert_query_equals_large_call(load_model_dir(default_model_dir()))


def test_small_model_query_equals_its_rows_in_a_large_call(two_torch_threads: None,
                                                           tiny_model_dir: Path) -> None:
    from elmo_model.api import load_model_dir

    _assert_query_equals_large_call(load_model_dir(tiny_model_dir))


def test_small_cpu_calls_run_on_one_thread(two_torch_threads: None) -> None:
    with threads_for_call(torch.device("cpu"), ONE_THREAD_MAX_TOKENS):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with threads_for_call(torch.device("cpu"), ONE_THREAD_MAX_TOKENS + 1):
        assert torch.get_num_threads() == 2


def _assert_positions_equal_embed(embedder: object) -> None:
    from elmo_model.query_position import position_layers

    for sentence in [["light"], *_sentences(5, seed=3)]:
        want = embedder.embed([sentence])[0]  # type: ignore[attr-defined]
        for position in range(len(sentence)):
            got = position_layers(embedder, sentence, position)  # type: ignore[arg-type]
            assert got.dtype == np.float32 and np.array_equal(got, want[:, position])


@pytest.mark.slow
def test_default_model_one_position_equals_the_whole_sentence() -> None:
    """Each direction run only as far as the token (the default model starts from its
    stored warm state): every position's layers are the whole sentence's, bit for bit."""
    from elmo_model.api import default_model_dir, load_model_dir

    _assert_positions_equal_embed(load_model_dir(default_model_dir()))


def test_small_model_one_position_equals_the_whole_sentence(tiny_model_dir: Path) -> None:
    from elmo_model.api import load_model_dir
    from elmo_model.errors import ElmoUserError
    from elmo_model.query_position import position_layers

    embedder = load_model_dir(tiny_model_dir)
    _assert_positions_equal_embed(embedder)
    with pytest.raises(ElmoUserError, match="outside a sentence of 2 tokens"):
        position_layers(embedder, ["a", "b"], 2)
