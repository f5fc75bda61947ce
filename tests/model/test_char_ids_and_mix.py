"""Char ids, the token cache and ScalarMix against a plain numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_model import ScalarMix, layer_mix
from elmo_model.char_ids import (
    BEGIN_SENTENCE,
    BEGIN_WORD,
    END_WORD,
    PADDING,
    batch_char_ids,
    token_char_ids,
)


def test_char_ids_are_shifted_utf8_bytes_with_word_markers() -> None:
    ids = token_char_ids("café")
    raw = list("café".encode())
    assert ids[0] == BEGIN_WORD + 1
    assert list(ids[1 : 1 + len(raw)]) == [b + 1 for b in raw]
    assert ids[1 + len(raw)] == END_WORD + 1
    assert set(ids[2 + len(raw) :]) == {PADDING + 1}
    assert token_char_ids("<S>")[:3].tolist() == [BEGIN_WORD + 1, BEGIN_SENTENCE + 1, END_WORD + 1]


def test_long_tokens_are_truncated_to_48_bytes() -> None:
    ids = token_char_ids("x" * 1000)
    assert ids.shape == (50,)
    assert ids[-1] == END_WORD + 1 and (ids[1:49] == ord("x") + 1).all()


def test_batch_char_ids_pads_with_zero() -> None:
    ids = batch_char_ids([["a"], ["b", "c"]])
    assert ids.shape == (2, 2, 50)
    assert not ids[0, 1].any() and ids[1, 1].all()


def _numpy_reference(layers: np.ndarray, s: np.ndarray, gamma: float, mask=None, norm=False):
    w = np.exp(s) / np.exp(s).sum()
    out = np.zeros(layers.shape[1:], dtype=np.float64)
    for j in range(len(layers)):
        h = layers[j].astype(np.float64)
        if norm:
            vals = h[mask]
            h = (h - vals.mean()) / np.sqrt(vals.var() + 1e-12)
        out += w[j] * h
    return gamma * out


@pytest.mark.parametrize("norm", [False, True])
def test_scalar_mix_and_numpy_twin_match_reference(norm: bool) -> None:
    rng = np.random.default_rng(0)
    layers = rng.normal(size=(3, 4, 5, 8)).astype(np.float32)
    mask = rng.random((4, 5)) > 0.3
    scalars, gamma = np.array([0.3, -1.0, 2.0]), 1.7
    want = _numpy_reference(layers, scalars, gamma, mask, norm)
    mix = ScalarMix(3, initial_weights=scalars.tolist(), gamma=gamma, layer_norm=norm)
    got_torch = mix(torch.from_numpy(layers), torch.from_numpy(mask)).detach().numpy()
    got_numpy = layer_mix(layers.astype(np.float16) if not norm else layers, scalars, gamma,
                          layer_norm=norm, mask=mask)
    assert np.allclose(got_torch, want, atol=1e-5)
    assert np.allclose(got_numpy, want, atol=2e-3 if not norm else 1e-5)
    assert got_numpy.dtype == np.float32


def test_scalar_mix_errors_say_what_mismatched() -> None:
    with pytest.raises(ValueError, match="2 initial weights for 3 layers"):
        ScalarMix(3, initial_weights=[0.0, 1.0])
    with pytest.raises(ValueError, match="built for 3 layers was given 2"):
        ScalarMix(3)([torch.zeros(2), torch.zeros(2)])
    with pytest.raises(ValueError, match="2 layers but 3 weights"):
        layer_mix([np.zeros(2), np.zeros(2)], [0, 0, 0])
    with pytest.raises(ValueError, match=r"layer 1 has shape \(4, 3\) but layer 0 has \(4, 2\)"):
        layer_mix([np.zeros((4, 2)), np.zeros((4, 3))], [0, 0])
    with pytest.raises(ValueError, match=r"mask has shape \(5,\) but the layers' tokens are"):
        ScalarMix(2, layer_norm=True)([torch.zeros(4, 2)] * 2, torch.ones(5, dtype=torch.bool))


@pytest.mark.slow
def test_scalar_mix_learns() -> None:
    torch.manual_seed(0)
    layers = torch.randn(3, 32, 4)
    target = layers[2] * 2.0
    mix = ScalarMix(3)
    optimizer = torch.optim.Adam(mix.parameters(), lr=0.1)
    for _ in range(200):
        optimizer.zero_grad()
        loss = ((mix(layers) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    assert torch.softmax(mix.scalars, 0)[2] > 0.9 and abs(mix.gamma.item() - 2.0) < 0.2


def test_token_cache_gives_same_vectors_and_counts_hits(tiny_model_dir) -> None:
    import elmo_model

    cached = elmo_model.load_model_dir(tiny_model_dir, device="cpu", cache_size=3)
    uncached = elmo_model.load_model_dir(tiny_model_dir, device="cpu", cache_size=0)
    sentences = [["the", "cat", "the", "dog"], ["the", "bird", "a", "cat"]]
    for _ in range(2):  # cached char-CNN vectors are bitwise the fresh ones
        for a, b in zip(cached.embed(sentences), uncached.embed(sentences), strict=True):
            assert np.array_equal(a, b)
    assert cached.cache is not None and len(cached.cache) == 3 and cached.cache.hits > 0


def test_token_vectors_are_bitwise_independent_of_batch(tiny_model_dir) -> None:
    import elmo_model
    from elmo_model.char_ids import token_char_ids

    model = elmo_model.load_model_dir(tiny_model_dir, device="cpu").model
    words = [f"word{i}" + "x" * (i % 11) for i in range(150)]
    ids = torch.from_numpy(np.stack([token_char_ids(w) for w in words]))
    with torch.inference_mode():
        everything = model.token_embedding(ids)
        for subset in ([3], [5, 99, 7], list(range(10, 140, 3))):
            assert torch.equal(model.token_embedding(ids[subset]), everything[subset])


def test_char_cnn_reads_only_the_char_positions_it_needs() -> None:
    """Cutting each token's convolutions to its real chars + the widest filter (rounded up
    to 8) gives the vectors of convolving all 50 positions, at every token length."""
    import torch.nn.functional as F

    from elmo_model.char_ids import BOS_TOKEN, token_char_ids
    from elmo_model.model import BiLMConfig, CharCNN

    torch.manual_seed(0)
    cnn = CharCNN(BiLMConfig(projection_dim=8, filters=((1, 4), (3, 8), (7, 16)),
                             n_highway=1)).eval()
    words = [BOS_TOKEN, "", "a", "né", "日本語"] + ["x" * n for n in range(1, 61)]
    ids = torch.from_numpy(np.stack([token_char_ids(w) for w in words]))
    widths = cnn.conv_widths(ids)
    assert widths[:3].tolist() == [16, 16, 16] and widths[-1] == 50
    assert (widths % 8 == 0).logical_or(widths == 50).all()
    with torch.inference_mode():
        got = cnn(ids)
        padded = F.pad(ids, (0, 0, 0, -len(words) % 64))
        full = torch.cat([cnn._dense(cnn._pooled(part), None) for part in padded.split(64)])
    assert torch.allclose(got, full[: len(words)], atol=1e-6)


def test_token_cache_keeps_its_table_when_the_device_has_an_index(tiny_model_dir) -> None:
    """A table asked for on "cuda" lives on "cuda:0" (here: "cpu:0" on "cpu"): the cache
    must not take the two for different devices and rebuild itself at every call."""
    import elmo_model
    from elmo_model.embedder import TokenCache

    model = elmo_model.load_model_dir(tiny_model_dir, device="cpu").model
    cache = TokenCache(capacity=10)
    device = torch.device("cpu:0")
    with torch.inference_mode():
        first = cache.lookup(model, ["the", "cat", "the"], device)
        again = cache.lookup(model, ["the", "cat", "dog"], device)
    assert (cache.misses, cache.hits) == (3, 2)
    assert torch.equal(first[:2], again[:2])
