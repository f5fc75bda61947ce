"""``elmo senses search``'s model in a process of its own (``query_model.ModelProcess``):
the same layers as the in-process embedder, the load's own error, and a close that does
not wait for a load still running.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import elmo_model
from elmo_model.errors import ElmoUserError
from pipeline.lookup.senses.query_model import ModelProcess

SENTENCES = [["The", "cat", "sat", "on", "the", "mat", "."], ["Play", "it", "again"]]


def test_layers_equal_the_in_process_embedders(tiny_model_dir: Path) -> None:
    options, weights = tiny_model_dir / "options.json", elmo_model.find_weights(tiny_model_dir)
    here = elmo_model.load(options, weights, mode="stateless", device="auto")
    with ModelProcess(options, weights) as model:
        there = model.embed(SENTENCES)
        again = model.embed(SENTENCES[:1])
    want = here.embed(SENTENCES)
    assert len(there) == len(want) == 2
    for a, b in zip(there, want, strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)
    assert np.array_equal(again[0], here.embed(SENTENCES[:1])[0])


def test_a_load_that_fails_raises_its_own_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    weights = tmp_path / "weights.safetensors"
    weights.write_bytes(b"not a safetensors file")
    with ModelProcess(tiny_model_dir / "options.json", weights) as model, \
            pytest.raises(Exception, match=r"safetensors|header|weights") as raised:
        model.embed(SENTENCES)
    assert not isinstance(raised.value, RuntimeError) or "stopped" not in str(raised.value)


def test_close_while_loading_ends_the_child_at_once(tiny_model_dir: Path) -> None:
    model = ModelProcess(tiny_model_dir / "options.json",
                         elmo_model.find_weights(tiny_model_dir))
    started = time.perf_counter()
    model.close()
    assert time.perf_counter() - started < 5
    assert not model._process.is_alive()


def test_the_cli_checks_its_settings_before_starting_a_model(tmp_path: Path) -> None:
    from pipeline.lookup.senses.search import check_search

    with pytest.raises(ElmoUserError, match="at least 1"):
        check_search(0, "forms")


def test_a_model_named_after_the_start_gives_the_same_layers(tiny_model_dir: Path) -> None:
    # `elmo senses search` starts the child first (torch imports there) and names the
    # model once the index has been opened.
    options, weights = tiny_model_dir / "options.json", elmo_model.find_weights(tiny_model_dir)
    here = elmo_model.load(options, weights, mode="stateless", device="auto")
    with ModelProcess() as model:
        with pytest.raises(RuntimeError, match="load first"):
            model.embed(SENTENCES)
        model.load(options, weights)
        with pytest.raises(RuntimeError, match="one model"):
            model.load(options, weights)
        there = model.embed(SENTENCES)
    for a, b in zip(there, here.embed(SENTENCES), strict=True):
        assert np.array_equal(a, b)


def test_close_before_a_model_is_named_ends_the_child() -> None:
    model = ModelProcess()
    model.close()
    assert not model._process.is_alive()
