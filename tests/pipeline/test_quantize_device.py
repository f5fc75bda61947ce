"""The torch int8 quantizer (elmo_model/quantize.py), which a GPU runs where its layers
are, gives byte for byte what the numpy reference (schemas.layers.quantize_int8) gives,
on CPU tensors (and CUDA ones where there is a GPU): random vectors and the cases where
rounding could differ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_model.quantize import quantize_int8_torch
from schemas.layers import INT8_LIMIT, quantize_int8

# The CPU always; a GPU too where there is one (bench/gpu_stages.sh runs this file there).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def assert_same_bytes(vectors: torch.Tensor, device: str = "cpu") -> None:
    """The torch result on ``device`` equals the reference on ``vectors`` widened to
    float32 (exact for float16 and bfloat16), bitwise: values and scales (a -0.0 scale
    would differ)."""
    q, scale = (t.cpu() for t in quantize_int8_torch(vectors.to(device)))
    flat = vectors.to(torch.float32).reshape(-1, vectors.shape[-1]).numpy()
    ref_q, ref_scale = quantize_int8(flat)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.shape == vectors.shape and scale.shape == vectors.shape[:-1]
    assert np.array_equal(q.reshape(-1, vectors.shape[-1]).numpy(), ref_q)
    assert scale.reshape(-1).numpy().tobytes() == ref_scale.tobytes()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("magnitude", [1e-30, 1e-3, 1.0, 37.0, 1e30])
def test_random_vectors_match_the_reference(magnitude: float, device: str) -> None:
    gen = torch.Generator().manual_seed(int(np.log10(magnitude)) + 40)
    # [layers, tokens, dim], as the embedder has them on the device
    vectors = torch.randn(3, 257, 96, generator=gen) * magnitude
    assert_same_bytes(vectors, device)
    heavy = torch.randn(400, 1024, generator=gen) ** 3 * magnitude  # long tails
    assert_same_bytes(heavy, device)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_round_half_to_even_as_the_reference(device: str) -> None:
    # absmax 127 -> scale exactly 1: x / scale is x, and k + 0.5 is a tie
    halves = torch.arange(-126, 127, dtype=torch.float32) + 0.5
    row = torch.cat([halves, torch.tensor([127.0])])
    # absmax 254 -> scale 2: odd integers divide to ties
    odd = torch.cat([torch.arange(-253, 254, 2, dtype=torch.float32), torch.tensor([254.0])])
    assert_same_bytes(row[None], device)
    assert_same_bytes(odd[None], device)
    q, _ = quantize_int8_torch(torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, 127.0]], device=device))
    assert q.tolist() == [[0, 2, 2, 0, -2, 127]]


@pytest.mark.parametrize("device", DEVICES)
def test_zero_vectors_clip_and_tiny_scales_match_the_reference(device: str) -> None:
    rows = torch.zeros(8, 16)
    rows[1] = -0.0  # scale +0.0, as the reference
    rows[2, 3] = 1e-40  # a subnormal: absmax / 127 underflows to a smaller subnormal
    rows[3, 0] = -1e-45  # the smallest subnormal: its scale is 0, the vector stays 0
    rows[4] = torch.from_numpy(np.linspace(-3.4e38, 3.4e38, 16).astype(np.float32))  # ~max
    rows[5] = torch.full((16,), -7.25)  # every value at the clip
    rows[6, ::2] = 1.0  # values exactly at the absmax: q is the limit
    rows[6, 1::2] = -1.0
    rows[7] = torch.tensor([np.nextafter(np.float32(1), np.float32(2))] + [1.0] * 15)
    assert torch.isfinite(rows).all()
    assert_same_bytes(rows, device)
    q, scale = (t.cpu() for t in quantize_int8_torch(rows.to(device)))
    assert scale[1].item() == 0 and not torch.signbit(scale[:2]).any()
    assert q.abs().max().item() == INT8_LIMIT


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_match_the_reference_on_their_float32_values(
        dtype: torch.dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(7)
    vectors = (torch.randn(64, 512, generator=gen) * 3).to(dtype)
    assert_same_bytes(vectors, device)
    # every bfloat16 / float16 bit pattern of one exponent band, as values of one vector
    band = torch.arange(0x3F80, 0x4000, dtype=torch.int16).view(torch.bfloat16) if (
        dtype == torch.bfloat16) else torch.arange(0x3C00, 0x4000, dtype=torch.int16
                                                   ).view(torch.float16)
    assert_same_bytes(band.reshape(-1, 64), device)


def test_integer_input_is_refused() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        quantize_int8_torch(torch.zeros(2, 4, dtype=torch.int8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["stateless", "stateful"])
def test_embed_int8_gives_the_reference_quantizer_of_embed(
        tiny_model_dir, one_torch_thread, mode: str, compute_dtype: str, device: str) -> None:
    """The embedder's int8 path (quantize where the model ran, copy to the host through
    ``HostCopier``) equals quantizing its float32 output with the numpy reference, for
    every sentence and layer, across several batches; and survives pickling, as a model
    worker hands it to item workers."""
    import pickle

    import elmo_model
    from pipeline.write.config import ModelSpec

    spec = ModelSpec.resolve(str(tiny_model_dir))
    embedder = elmo_model.load(spec.options, spec.weights, mode=mode, device=device,
                               dtype=compute_dtype, max_batch_tokens=24)
    words = ["the", "cat", "sat", "on", "a", "mat", "while", "the", "old", "man", "looked",
             "at", "the", "river"]
    sentences = [words[:4], ["A"], words * 2, words[3:9], words[::-1], ["."]]
    floats = embedder.embed(sentences)
    embedder.reset_state()
    pending = embedder.submit_int8(sentences)
    # stateless: several model batches (on the CPU quantized into one block for the call)
    assert (len(embedder._batches(sentences)) == 1) == (mode == "stateful")
    layers = pickle.loads(pickle.dumps(pending.result()))
    assert len(layers) == len(sentences)
    for i, vectors in enumerate(floats):
        values, scales = layers.sentence(i)
        n_layers, n, dim = vectors.shape
        ref_values, ref_scales = quantize_int8(vectors.reshape(-1, dim))
        assert values.shape == (n_layers, n, dim) and scales.shape == (n_layers, n)
        assert np.array_equal(values.reshape(-1, dim), ref_values)
        assert scales.reshape(-1).tobytes() == ref_scales.tobytes()


def test_a_dataset_does_not_depend_on_where_its_layers_were_quantized(
        tiny_model_dir, one_torch_thread, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole device path on the CPU: the model quantizes each batch and hands the
    writer int8 values and scales (as on a GPU), against the writer quantizing float32
    layers: the same files, byte for byte."""
    from helpers import config, dataset_files, write_corpus

    from pipeline.write import work_item
    from pipeline.write.embed import embed_corpus

    corpus = write_corpus(tmp_path / "corpus")
    kw = {"min_items": 3, "batch_tokens": 8}
    with monkeypatch.context() as writer_quantizes:  # float32 layers to the writer
        writer_quantizes.setattr(work_item, "quantizes_on_device", lambda embedder, dtype: False)
        embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / "writer", **kw))
    asked = []

    def on_device(embedder, dtype: str) -> bool:
        asked.append(dtype)
        return dtype == "int8"

    monkeypatch.setattr(work_item, "quantizes_on_device", on_device)
    embed_corpus(config(tiny_model_dir, [f"{corpus}/*"], tmp_path / "model", **kw))
    assert asked == ["int8"]
    by_writer, by_model = dataset_files(tmp_path / "writer"), dataset_files(tmp_path / "model")
    assert by_writer.keys() == by_model.keys() and any("types" in k for k in by_writer)
    for key, table in by_writer.items():
        assert by_model[key].equals(table), key
        assert (tmp_path / "model" / key).read_bytes() == (tmp_path / "writer" / key
                                                            ).read_bytes(), key


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_layer_0_per_type_is_each_occurrences_layer_0(
        tiny_model_dir, one_torch_thread, compute_dtype: str) -> None:
    """``submit_int8(..., layer_0_per_type=True)`` (what the CPU model stage hands the
    writer): layers 1..L are the reference call's rows, and layer 0 of each distinct
    token, quantized once, is bytewise every occurrence's layer 0 there, in whichever
    batch it stood (the token cache on and off)."""
    import elmo_model
    from pipeline.write.config import ModelSpec

    spec = ModelSpec.resolve(str(tiny_model_dir))
    words = ["the", "cat", "sat", "on", "a", "mat", "while", "the", "old", "man", "looked",
             "at", "the", "river", "cat"]
    sentences = [words[:4], ["A"], words * 2, words[3:9], words[::-1], ["."]]
    for cache_size in (0, 100):
        embedder = elmo_model.load(spec.options, spec.weights, device="cpu",
                                   dtype=compute_dtype, max_batch_tokens=24,
                                   cache_size=cache_size)
        want = embedder.embed_int8(sentences)
        got = embedder.submit_int8(sentences, layer_0_per_type=True).result()
        assert want.layer_0 is None and got.layer_0 is not None and got.first_layer == 1
        assert len(got.layer_0.tokens) == len(set(got.layer_0.tokens))
        for i, sentence in enumerate(sentences):
            (want_values, want_scales), (values, scales) = want.sentence(i), got.sentence(i)
            assert np.array_equal(values, want_values[1:])
            assert scales.tobytes() == want_scales[1:].tobytes()
            rows = got.layer_0.rows_of(sentence)
            assert np.array_equal(got.layer_0.values[rows], want_values[0])
            assert got.layer_0.scales[rows].tobytes() == want_scales[0].tobytes()


def test_packed_layers_quantize_as_their_canonical_rows() -> None:
    """``quantize_int8_packed`` (the CPU model stage) reads each token's forward and
    backward halves where the biLM left them, in packed order; its bytes are the
    reference's on the canonical ``[h_fwd; h_bwd]`` rows of the real tokens, whichever
    half holds the larger magnitude, for zero halves, ties and long tails too."""
    from elmo_model.pack_plan import PackPlan
    from elmo_model.quantize import quantize_int8_packed

    gen = torch.Generator().manual_seed(5)
    lengths = [3, 1, 7, 2]
    plan = PackPlan.build(np.array([n + 2 for n in lengths]))  # with <S> and </S>
    p = 48  # rows 1-3, 6 and 9-15 are real tokens: starts 0, 5, 8, 17
    canonical = torch.randn(2, plan.n_tokens, 2 * p, generator=gen) ** 3  # [k, N, 2P]
    canonical[0, 1, :p] = 0.0  # a zero half: the other sets the scale
    canonical[1, 2] = 0.0  # a zero vector: scale +0.0
    canonical[1, 3, p:] *= 1e4  # the backward half far larger
    canonical[0, 6] = torch.arange(2 * p, dtype=torch.float32) - p + 0.5  # ties
    packed = [torch.stack([layer[plan.forward_index, :p], layer[plan.backward_index, p:]])
              for layer in canonical]
    # each sentence's rows where the caller keeps them: here last sentence first
    starts = [10, 9, 2, 0]
    values = np.zeros((2, 13, 2 * p), np.int8)
    scales = np.full((2, 13), -1.0, np.float32)
    quantize_int8_packed(packed, plan, lengths, values, scales, starts)
    boundaries = np.cumsum([0, *(n + 2 for n in lengths[:-1])])
    for k, layer in enumerate(canonical):
        for begin, start, n in zip(boundaries, starts, lengths, strict=True):
            ref_values, ref_scales = quantize_int8(layer[begin + 1:begin + 1 + n].numpy())
            assert np.array_equal(values[k, start:start + n], ref_values)
            assert scales[k, start:start + n].tobytes() == ref_scales.tobytes()
    with pytest.raises(ValueError, match="the plan has"):
        quantize_int8_packed(packed, plan, lengths[1:], values, scales, starts[1:])
    # a residual added to the last layer as it is quantized: the bytes of the float32 sum
    residual = torch.randn(plan.n_tokens, 2 * p, generator=gen) ** 3
    packed_residual = torch.stack([residual[plan.forward_index, :p],
                                   residual[plan.backward_index, p:]])
    first_layer = values[0].copy()
    quantize_int8_packed(packed, plan, lengths, values, scales, starts, packed_residual)
    assert np.array_equal(values[0], first_layer)
    summed = canonical[1] + residual
    for begin, start, n in zip(boundaries, starts, lengths, strict=True):
        ref_values, ref_scales = quantize_int8(summed[begin + 1:begin + 1 + n].numpy())
        assert np.array_equal(values[1, start:start + n], ref_values)
        assert scales[1, start:start + n].tobytes() == ref_scales.tobytes()


def test_stored_rows_are_a_view_of_one_block_and_a_copy_otherwise() -> None:
    """``Int8Layers.stored_rows``: the windows' own rows, one after the other. When they
    lie so in the CPU's one block it hands out a view (no copy of the unit); a window that
    keeps only part of its rows (an overlap), or rows in several blocks, give a copy with
    the same rows."""
    from elmo_model.device_copy import Int8Layers

    block = np.arange(2 * 9 * 4, dtype=np.int64).astype(np.int8).reshape(2, 9, 4)
    scales = np.arange(18, dtype=np.float32).reshape(2, 9)
    one = Int8Layers([block], [scales], [(0, 0, 3), (0, 3, 4), (0, 7, 2)])
    values, got_scales = one.stored_rows(np.array([0, 0, 0]), np.array([3, 4, 2]))
    assert np.shares_memory(values, block) and np.array_equal(values, block)
    assert np.array_equal(got_scales, scales)
    values, got_scales = one.stored_rows(np.array([0, 1, 0]), np.array([3, 4, 2]))  # overlap
    assert not np.shares_memory(values, block)
    assert np.array_equal(values, np.delete(block, 3, axis=1))
    assert np.array_equal(got_scales, np.delete(scales, 3, axis=1))
    split = Int8Layers([block[:, :3], block[:, 3:]], [scales[:, :3], scales[:, 3:]],
                       [(0, 0, 3), (1, 0, 4), (1, 4, 2)])
    values, got_scales = split.stored_rows(np.array([0, 0, 0]), np.array([3, 4, 2]))
    assert np.array_equal(values, block) and np.array_equal(got_scales, scales)
