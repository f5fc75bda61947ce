"""The inference runner (``elmo_model.packed_runner``) against the reference forward pass
(``BiLM.contextualize``): into the caller's buffers, canonical or left packed, with the
first layer reading distinct tokens, and with the last residual left to the caller."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import STEP_TEST_CONFIG as CONFIG
from helpers import STEP_TEST_LENGTHS as LENGTHS

from elmo_model.model import BiLM, BiLMConfig, PackPlan
from elmo_model.packed_runner import CanonicalLayers, PackedLayers, PackedRunner
from elmo_model.steps.onednn import OnednnStep


def buffers(config: BiLMConfig, plan: PackPlan, fill: float = float("nan")
            ) -> list[torch.Tensor]:
    return [torch.full((2, plan.n_tokens, config.projection_dim), fill)
            for _ in range(config.n_layers + 1)]


def assert_same_state(state: list, want_state: list) -> None:
    for (h, c), (want_h, want_c) in zip(state, want_state, strict=True):
        assert torch.equal(h, want_h) and torch.equal(c, want_c)


def test_canonical_layers_into_a_given_output() -> None:
    """The embedder hands the runner the LSTM rows of its own ``[L + 1, N, 2P]`` (no
    second copy of every layer); the layers are the reference's, bit for bit."""
    torch.manual_seed(0)
    model = BiLM(CONFIG).eval()
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim)
    runner = PackedRunner(model, OnednnStep())
    with torch.inference_mode():
        want, want_state = model.contextualize(tokens, plan, step=OnednnStep())
        mine = torch.full((CONFIG.n_layers + 1, plan.n_tokens, 2 * CONFIG.projection_dim),
                          float("nan"))
        got, state = runner.run(tokens, plan, buffers(CONFIG, plan),
                                output=CanonicalLayers(mine[1:]))
        assert got is not None and got.data_ptr() == mine[1].data_ptr()
        assert torch.equal(mine[1:], want)
        assert mine[0].isnan().all()  # the row before is the caller's, untouched
        assert_same_state(state, want_state)
        with pytest.raises(ValueError, match=r"out must be float32 \[2, "):
            runner.run(tokens, plan, buffers(CONFIG, plan),
                       output=CanonicalLayers(mine[1:].double()))
        with pytest.raises(ValueError, match="out must be float32"):
            runner.run(tokens, plan, buffers(CONFIG, plan), output=CanonicalLayers(mine[:1]))
        with pytest.raises(ValueError, match="buffers must be 3 packed layers"):
            runner.run(tokens, plan, buffers(CONFIG, plan)[1:])


@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_the_callers_packed_buffers_hold_every_layer(n_layers: int) -> None:
    """The buffers get the packed input, then each LSTM layer's packed output with the
    residual added, the reference's layers at any depth; ``PackedLayers`` makes no
    canonical copy."""
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, n_layers=n_layers)
    model = BiLM(config).eval()
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, config.projection_dim)
    forward_at, backward_at = plan.packed_positions()
    p = config.projection_dim
    with torch.inference_mode():
        want, want_state = model.contextualize(tokens, plan, step=OnednnStep())
        for output in (CanonicalLayers(), PackedLayers()):
            packed = buffers(config, plan)
            got, state = PackedRunner(model, OnednnStep()).run(tokens, plan, packed,
                                                               output=output)
            assert (got is None) == isinstance(output, PackedLayers)
            if got is not None:
                assert torch.equal(got, want)
            assert torch.equal(packed[0][0][forward_at], tokens)
            assert torch.equal(packed[0][1][backward_at], tokens)
            for j in range(n_layers):
                assert torch.equal(packed[j + 1][0][forward_at], want[j, :, :p])
                assert torch.equal(packed[j + 1][1][backward_at], want[j, :, p:])
            assert_same_state(state, want_state)


def test_distinct_tokens_give_the_gathered_tokens_layers() -> None:
    """``token_rows``: ``tokens`` holds each distinct token once; the layers and the state
    are those of the gathered ``[N, P]`` tokens and the input buffer is left alone."""
    torch.manual_seed(3)
    model = BiLM(CONFIG).eval()
    plan = PackPlan.build(LENGTHS)
    distinct = torch.randn(9, CONFIG.projection_dim)
    token_rows = torch.randint(0, 9, (plan.n_tokens,))
    with torch.inference_mode():
        want, want_state = model.contextualize(distinct[token_rows], plan, step=OnednnStep())
        packed = buffers(CONFIG, plan)
        got, state = PackedRunner(model, OnednnStep()).run(distinct, plan, packed,
                                                           token_rows=token_rows)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        for (h, c), (want_h, want_c) in zip(state, want_state, strict=True):
            torch.testing.assert_close(h, want_h, atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(c, want_c, atol=1e-6, rtol=1e-6)
        assert packed[0].isnan().all()


@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_the_last_residual_left_to_the_caller(n_layers: int) -> None:
    """``PackedLayers(last_residual=False)``: the last layer's buffer holds its own output,
    and adding the buffer before it gives, bitwise, the layer with its residual; the other
    layers and the state are untouched. A single layer has no residual: nothing is left
    out."""
    torch.manual_seed(4)
    config = dataclasses.replace(CONFIG, n_layers=n_layers)
    model = BiLM(config).eval()
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, config.projection_dim)
    p = config.projection_dim
    forward_at, backward_at = plan.packed_positions()
    with torch.inference_mode():
        want, want_state = model.contextualize(tokens, plan, step=OnednnStep())
        packed = buffers(config, plan, 0.0)
        _, state = PackedRunner(model, OnednnStep()).run(
            tokens, plan, packed, output=PackedLayers(last_residual=False))
    last = packed[-1] + packed[-2] if config.has_residual(n_layers - 1) else packed[-1]
    for j, layer in enumerate([*packed[1:-1], last]):
        assert torch.equal(layer[0][forward_at], want[j, :, :p])
        assert torch.equal(layer[1][backward_at], want[j, :, p:])
    assert_same_state(state, want_state)
