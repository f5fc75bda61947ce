"""The CPU's oneDNN inference step (``lstm_impl="onednn"``, what ``auto`` picks on the CPU):
its matmuls, the char CNN through them, and the packing cache behind it. Its recurrence
against the reference step: ``test_lstm_steps.py``."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from helpers import STEP_TEST_CONFIG as CONFIG
from helpers import STEP_TEST_LENGTHS as LENGTHS
from helpers import layer_plan_input, run_layer

from elmo_model import lstm_steps
from elmo_model.errors import ElmoUserError
from elmo_model.model import BiLM, BiLstmLayer, PackPlan, reference_step
from elmo_model.steps.onednn import OnednnStep, PackedLinear, onednn_unavailable


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


def test_char_cnn_matmuls_through_onednn_match() -> None:
    torch.manual_seed(2)
    model = BiLM(CONFIG).eval()
    ids = torch.randint(1, CONFIG.n_characters, (150, CONFIG.max_chars))
    linears = OnednnStep().char_cnn_linears(model.char_cnn, torch.float32)
    with torch.inference_mode():
        plain = model.char_cnn(ids)
        packed = model.char_cnn(ids, linears)
        assert torch.allclose(packed, plain, atol=1e-5)
        for subset in ([3], [5, 99, 7], list(range(10, 140, 3))):  # bitwise, any batch
            assert torch.equal(model.char_cnn(ids[subset], linears), packed[subset])


def test_packing_follows_weight_changes() -> None:
    """A packing is kept while the weights stay, rebuilt when they are loaded or an
    in-place edit is declared with ``weights_changed()``."""
    from elmo_model.steps.onednn import _LAYER_PACKINGS

    layer, plan, x, state = layer_plan_input(seed=3)
    step = OnednnStep()
    run_layer(layer, plan, x, state, step)
    packing = _LAYER_PACKINGS.get(layer, torch.float32, list)
    run_layer(layer, plan, x, state, OnednnStep())  # another embedder's step shares it
    assert _LAYER_PACKINGS.get(layer, torch.float32, list) is packing
    with torch.no_grad():
        layer.recurrent_weight.mul_(0.5)
    layer.weights_changed()
    want = run_layer(layer, plan, x, state, reference_step)
    assert torch.allclose(run_layer(layer, plan, x, state, step)[0], want[0], atol=1e-5)
    other = BiLstmLayer(CONFIG)
    layer.load_state_dict(other.state_dict())
    want = run_layer(layer, plan, x, state, reference_step)
    assert torch.allclose(run_layer(layer, plan, x, state, step)[0], want[0], atol=1e-5)
    model = BiLM(CONFIG)  # loading the whole model reaches each layer's version
    before = model.layers[1].weights_version
    model.load_state_dict(BiLM(CONFIG).state_dict())
    assert model.layers[1].weights_version == before + 1


def test_model_stays_picklable_and_copyable_after_onednn_runs() -> None:
    torch.manual_seed(4)
    model = BiLM(CONFIG).eval()
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim)
    step = OnednnStep()
    with torch.inference_mode():
        want, _ = model.contextualize(tokens, plan, step=step)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        with torch.inference_mode():
            got, _ = clone.contextualize(tokens, plan, step=step)
        assert torch.equal(got, want)
        clone.load_state_dict(model.state_dict())  # the load hook survives the copy
        assert clone.layers[0].weights_version == model.layers[0].weights_version + 1
    for step_clone in (copy.deepcopy(step), pickle.loads(pickle.dumps(step))):  # its lock
        with torch.inference_mode():  # and kept buffer are not copied: made anew
            assert torch.equal(model.contextualize(tokens, plan, step=step_clone)[0], want)


def test_onednn_is_refused_off_the_cpu() -> None:
    assert lstm_steps.choose_step("onednn", "cpu").reason == "set explicitly"
    with pytest.raises(ElmoUserError, match="lstm_impl onednn cannot run on cuda: it is for "
                                            "the CPU; use auto or torch"):
        lstm_steps.choose_step("onednn", "cuda")


def test_a_dtype_onednn_refuses_gets_the_torch_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where oneDNN cannot run bf16 (a CPU without the instructions it wants), ``auto``
    chooses the torch step for a bf16 embedder, and ``onednn`` is refused, before any
    embedding starts."""
    from elmo_model.steps.torch_step import TorchStep

    monkeypatch.setattr(lstm_steps, "onednn_unavailable",
                        lambda dtype=torch.float32: "no bf16 here" if dtype != torch.float32
                        else None)
    chosen = lstm_steps.choose_step("auto", "cpu", torch.bfloat16)
    assert (chosen.name, chosen.reason) == ("torch", "no bf16 here")
    assert isinstance(chosen.step, TorchStep)
    assert lstm_steps.choose_step("auto", "cpu", torch.float32).name == "onednn"
    with pytest.raises(ElmoUserError, match="onednn cannot run on cpu: no bf16 here"):
        lstm_steps.choose_step("onednn", "cpu", torch.bfloat16)
