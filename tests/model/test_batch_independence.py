"""Same bytes whatever the batch (issue 50): a sentence's vectors do not depend on which
other sentences share its batch, at the kernel (one LSTM layer run by the CPU's step) and
through the embedder's int8 output on the default model. The stored dataset's side is in
tests/pipeline/test_same_bytes_any_grouping.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_model.model import BiLMConfig, BiLstmLayer, PackPlan
from elmo_model.pack_plan import DistinctInput, packed_input
from elmo_model.steps.onednn import OnednnStep

# An LSTM width that is a multiple of 32: the cell's element-wise ops then never reach
# torch's scalar loop tail, whose rounding differs from its vector loop's (docs/
# dataset_format.md, "Same bytes whatever the batch").
CONFIG = BiLMConfig(n_layers=1, lstm_dim=64, projection_dim=16, cell_clip=0.5, proj_clip=0.3)
TARGET = 9  # the sentence followed through every batch: 9 positions
# Batches the target shares: alone (every step one row), the longest with shorter ones
# (its last steps alone), in the middle, the shortest, tied with another.
BATCHES = [[TARGET], [3, TARGET, 5], [12, TARGET, 2, 7], [TARGET, 20, 15, 11], [TARGET, TARGET]]
STEPS = {"in place": OnednnStep, "all oneDNN": lambda: OnednnStep(in_place_max_bytes=0)}


def _layer() -> BiLstmLayer:
    torch.manual_seed(0)
    layer = BiLstmLayer(CONFIG).eval()
    with torch.no_grad():
        layer.bias.normal_(0.0, 0.5)
        layer.recurrent_weight.mul_(4)  # large enough that both clips bite
        layer.projection.mul_(8)
    return layer


def _target_rows(layer: BiLstmLayer, step: OnednnStep, lengths: list[int], distinct: bool,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's (first sentence of length TARGET) output rows ``[2, TARGET, P]``
    (canonical order) and final state, from one layer run over the batch ``lengths``: the
    target's inputs are the same in every batch, the others' drawn at random."""
    generator = torch.Generator().manual_seed(len(lengths))
    tokens = [torch.randn(n, CONFIG.projection_dim, generator=generator) for n in lengths]
    at = lengths.index(TARGET)
    tokens[at] = torch.randn(TARGET, CONFIG.projection_dim,
                             generator=torch.Generator().manual_seed(7))
    plan = PackPlan.build(np.array(lengths))
    x = DistinctInput(torch.cat(tokens), plan.token_index)
    h = torch.full((2, len(lengths), CONFIG.projection_dim), 0.1)
    c = torch.full((2, len(lengths), CONFIG.lstm_dim), -0.2)
    rank = int(np.flatnonzero(plan.order == at)[0])
    with torch.inference_mode(), torch.autocast("cpu", dtype=dtype,
                                                enabled=dtype != torch.float32):
        out, final_h, final_c = layer(x if distinct else packed_input(x), plan,
                                      h[:, plan.order], c[:, plan.order], step)
    forward_at, backward_at = plan.packed_positions()
    rows = np.arange(sum(lengths[:at]), sum(lengths[:at]) + TARGET)
    canonical = torch.stack([out[0, forward_at[rows]], out[1, backward_at[rows]]])
    return canonical, final_h[:, rank], final_c[:, rank]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("distinct", [True, False], ids=["distinct input", "packed input"])
@pytest.mark.parametrize("path", sorted(STEPS))
def test_a_sentence_gets_the_same_bits_in_any_batch(path: str, distinct: bool,
                                                    dtype: torch.dtype,
                                                    one_torch_thread: None) -> None:
    layer, step = _layer(), STEPS[path]()
    alone = _target_rows(layer, step, BATCHES[0], distinct, dtype)
    for lengths in BATCHES[1:]:
        shared = _target_rows(layer, step, lengths, distinct, dtype)
        for part, a, b in zip(("output", "final h", "final c"), alone, shared, strict=True):
            assert torch.equal(a, b), f"{part} differs in batch {lengths}"


@pytest.mark.slow
def test_default_model_int8_bytes_do_not_depend_on_grouping(one_torch_thread: None) -> None:
    """The default model's stored int8 rows of each sentence, embedded in one call, in two,
    reversed, in batches of another size, and each sentence alone: byte for byte equal."""
    from elmo_model.api import default_model_dir, load_model_dir
    from elmo_model.embedder import WARM_UP_TEXT

    rng = np.random.default_rng(0)
    words = " ".join(WARM_UP_TEXT).split()
    # distinct lengths, so that each batch's longest sentence runs its last steps alone
    sentences = [[words[i] for i in rng.integers(0, len(words), n)]
                 for n in rng.permutation(np.arange(2, 62))]
    embedder = load_model_dir(default_model_dir())

    def stored(group: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
        layers = embedder.embed_int8(group)
        return [layers.sentence(i) for i in range(len(group))]

    want = stored(sentences)
    half = len(sentences) // 2
    groupings = {"two calls": stored(sentences[:half]) + stored(sentences[half:]),
                 "reversed": stored(sentences[::-1])[::-1],
                 "alone": [stored([s])[0] for s in sentences[:12]]}
    embedder.max_batch_tokens = 150
    groupings["150-token batches"] = stored(sentences)
    for name, got in groupings.items():
        for i, ((values, scales), (want_values, want_scales)) in enumerate(
                zip(got, want, strict=False)):
            assert np.array_equal(values, want_values), f"{name}: sentence {i}'s values"
            assert np.array_equal(scales.view(np.uint32), want_scales.view(np.uint32)), \
                f"{name}: sentence {i}'s scales"
