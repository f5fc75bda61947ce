"""The server's ``LayerCache.position``: a lone search's token layers, run only as far as
the token, are those of the whole sentence, kept by (sentence, position), and read from
a whole sentence's kept layers when there are some."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.lookup.senses.search import QueryToken
from pipeline.lookup.serve.batching import LayerCache


def test_position_layers_equal_the_sentences_and_are_kept(tiny_model_dir: Path) -> None:
    from elmo_model.api import load_model_dir

    embedder = load_model_dir(tiny_model_dir)
    sentence = ["the", "river", "ran", "past", "the", "old", "mill"]
    want = embedder.embed([sentence])[0]
    cache = LayerCache(embedder)
    first = cache.position(QueryToken(sentence, 3))
    assert np.array_equal(first, want[:, 3])
    assert not cache.kept and list(cache.positions) == [(tuple(sentence), 3)]
    assert cache.position(QueryToken(sentence, 3)) is first  # kept: no second run
    assert cache.bytes == first.nbytes

    cache.embed([sentence])  # the whole sentence kept: its rows answer every position
    for position in range(len(sentence)):
        assert np.array_equal(cache.position(QueryToken(sentence, position)),
                              want[:, position])
    assert len(cache.positions) == 1


def test_positions_are_bounded_like_sentences(tiny_model_dir: Path) -> None:
    from elmo_model.api import load_model_dir

    cache = LayerCache(load_model_dir(tiny_model_dir), size=2)
    for word in ("a", "b", "c"):
        cache.position(QueryToken([word, "and", "more"], 0))
    assert [key[0][0] for key in cache.positions] == ["b", "c"]
    assert cache.bytes == sum(layers.nbytes for layers in cache.positions.values())
