"""The CPU's oneDNN inference step (``lstm_impl="onednn"``, what ``auto`` picks on the CPU)
against the reference torch step, and the packing cache behind it."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from elmo_model.model import BiLM, BiLMConfig, BiLstmLayer, PackPlan
from elmo_model.onednn import PackedLinear, onednn_unavailable

# Small, with sizes that are not powers of two, and clips low enough to be hit often.
CONFIG = BiLMConfig(n_layers=2, lstm_dim=40, projection_dim=12, cell_clip=0.5, proj_clip=0.3,
                    char_embedding_dim=4, filters=((1, 4), (2, 8), (3, 20)), n_highway=2)
LENGTHS = np.array([5, 2, 7, 1, 4, 7, 3])


def _layer_plan_input(seed: int = 0) -> tuple[BiLstmLayer, PackPlan, torch.Tensor,
                                               tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)
    layer = BiLstmLayer(CONFIG).eval()
    with torch.no_grad():
        layer.bias.normal_(0.0, 0.5)
        layer.recurrent_weight.mul_(4)  # large enough that both clips bite
        layer.projection.mul_(8)
    plan = PackPlan.build(LENGTHS)
    x = torch.randn(2, plan.n_tokens, CONFIG.projection_dim)
    batch, p, d = len(LENGTHS), CONFIG.projection_dim, CONFIG.lstm_dim
    state = (torch.randn(2, batch, p) * 0.2, torch.randn(2, batch, d) * 0.4)
    return layer, plan, x, state


def _run(layer: BiLstmLayer, plan: PackPlan, x: torch.Tensor, state, impl: str,
         dtype: torch.dtype | None = None):
    with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.bfloat16,
                                                enabled=dtype is not None):
        return layer(x, plan, state[0], state[1], impl)


def test_onednn_runs_in_this_torch_build() -> None:
    assert onednn_unavailable() is None  # the pinned CPU wheel has it; auto relies on it


def test_packed_linear_is_a_matmul_plus_bias() -> None:
    torch.manual_seed(0)
    weight, bias, x, extra = (torch.randn(24, 10), torch.randn(10), torch.randn(5, 24),
                              torch.randn(5, 10))
    linear = PackedLinear(weight, bias, rows=8)
    assert torch.allclose(linear(x), x @ weight + bias, atol=1e-5)
    assert torch.allclose(linear(x, add=extra), x @ weight + bias + extra, atol=1e-5)
    assert torch.allclose(linear(x[::2]), x[::2] @ weight + bias, atol=1e-5)  # strided rows
    with pytest.raises(TypeError, match=r"float32 weights; x is torch\.bfloat16"):
        linear(x.bfloat16())


def test_fp32_step_matches_the_reference_step() -> None:
    layer, plan, x, state = _layer_plan_input()
    want = _run(layer, plan, x, state, "reference")
    got = _run(layer, plan, x, state, "onednn")
    for name, a, b in zip(("output", "final h", "final c"), got, want, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape, name
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (name, (a - b).abs().max())
    out, _, c = got
    assert (out.abs() == CONFIG.proj_clip).float().mean() > 0.05  # the clips were exercised
    assert (c.abs() == CONFIG.cell_clip).float().mean() > 0.05


def test_bf16_step_stays_with_fp32_and_the_bf16_reference() -> None:
    layer, plan, x, state = _layer_plan_input(seed=1)
    fp32 = _run(layer, plan, x, state, "reference")[0]
    reference_bf16 = _run(layer, plan, x, state, "reference", torch.bfloat16)[0]
    got = _run(layer, plan, x, state, "onednn", torch.bfloat16)[0]
    assert got.dtype == torch.float32  # state and outputs stay fp32; only matmuls are bf16
    assert torch.allclose(got, reference_bf16, atol=2e-3)
    cosine = torch.nn.functional.cosine_similarity(got, fp32, dim=-1)
    assert cosine.min() >= 0.999, cosine.min()


def test_char_cnn_matmuls_through_onednn_match() -> None:
    torch.manual_seed(2)
    model = BiLM(CONFIG).eval()
    ids = torch.randint(1, CONFIG.n_characters, (150, CONFIG.max_chars))
    with torch.inference_mode():
        plain = model.char_cnn(ids)
        packed = model.char_cnn(ids, onednn=torch.float32)
        assert torch.allclose(packed, plain, atol=1e-5)
        for subset in ([3], [5, 99, 7], list(range(10, 140, 3))):  # bitwise, any batch
            assert torch.equal(model.char_cnn(ids[subset], onednn=torch.float32), packed[subset])


def test_packing_follows_weight_changes() -> None:
    """A packing is rebuilt when a parameter changes in place or is loaded."""
    layer, plan, x, state = _layer_plan_input(seed=3)
    _run(layer, plan, x, state, "onednn")
    with torch.no_grad():
        layer.recurrent_weight.mul_(0.5)
    want = _run(layer, plan, x, state, "reference")
    assert torch.allclose(_run(layer, plan, x, state, "onednn")[0], want[0], atol=1e-5)
    other = BiLstmLayer(CONFIG)
    layer.load_state_dict(other.state_dict())
    want = _run(layer, plan, x, state, "reference")
    assert torch.allclose(_run(layer, plan, x, state, "onednn")[0], want[0], atol=1e-5)


def test_model_stays_picklable_and_copyable_after_onednn_runs() -> None:
    torch.manual_seed(4)
    model = BiLM(CONFIG).eval()
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim)
    with torch.inference_mode():
        want, _ = model.contextualize(tokens, plan)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        with torch.inference_mode():
            got, _ = clone.contextualize(tokens, plan)
        assert torch.equal(got, want)


def test_onednn_is_refused_off_the_cpu() -> None:
    model = BiLM(CONFIG)
    model.lstm_impl = "onednn"
    assert model.resolve_lstm_impl("cpu") == ("onednn", "set explicitly")
    with pytest.raises(ValueError, match="lstm_impl onednn cannot run on cuda: it is for the CPU"):
        model.resolve_lstm_impl("cuda")


def test_a_dtype_onednn_refuses_falls_back_to_the_torch_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where oneDNN cannot run bf16 (a CPU without the instructions it wants), the bf16
    matmuls take the torch step instead of failing mid-embed."""
    from elmo_model import onednn

    layer, plan, x, state = _layer_plan_input(seed=6)
    want = _run(layer, plan, x, state, "reference", torch.bfloat16)
    monkeypatch.setattr(onednn, "onednn_unavailable",
                        lambda dtype=torch.float32: "no bf16 here" if dtype != torch.float32
                        else None)
    monkeypatch.setattr(onednn.PackedLinear, "__init__", _refuse)
    assert torch.equal(_run(layer, plan, x, state, "onednn", torch.bfloat16)[0], want[0])


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("no oneDNN packing may be built for a refused dtype")
