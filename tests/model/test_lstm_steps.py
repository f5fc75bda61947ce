"""Every LSTM step that runs on this CPU against the reference recurrence, and the one
place that chooses a step (``elmo_model.lstm_steps``). The fused Triton step is checked
the same way under Triton's interpreter in ``test_fused_lstm.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import STEP_TEST_CONFIG as CONFIG
from helpers import STEP_TEST_LENGTHS as LENGTHS
from helpers import layer_plan_input, run_layer

from elmo_model import lstm_steps
from elmo_model.errors import ElmoUserError
from elmo_model.model import BiLM, LstmStep, PackPlan, reference_step
from elmo_model.pack_plan import DistinctInput, packed_input
from elmo_model.steps.onednn import OnednnStep
from elmo_model.steps.torch_step import TorchStep

# "onednn" runs its float32 in-place path on these small weights; "onednn-packed" is the
# path it takes for large recurrent weights (every matmul through oneDNN).
FAST_CPU_STEPS = {"torch": TorchStep, "onednn": OnednnStep,
                  "onednn-packed": lambda: OnednnStep(in_place_max_bytes=0)}


@pytest.mark.parametrize("name", sorted(FAST_CPU_STEPS))
def test_fp32_step_matches_the_reference_step(name: str) -> None:
    layer, plan, x, state = layer_plan_input()
    want = run_layer(layer, plan, x, state, reference_step)
    got = run_layer(layer, plan, x, state, FAST_CPU_STEPS[name]())
    for part, a, b in zip(("output", "final h", "final c"), got, want, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape, part
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=f"{name} {part}")
    out, _, c = want
    assert (out.abs() == CONFIG.proj_clip).float().mean() > 0.05  # the clips were exercised
    assert (c.abs() == CONFIG.cell_clip).float().mean() > 0.05


def test_the_in_place_buffer_serves_batches_of_any_size() -> None:
    """One step object, its kept buffer grown by a large batch and reused by a smaller one
    and a larger one again: each call equals the reference."""
    layer, _, _, _ = layer_plan_input()
    p, d = CONFIG.projection_dim, CONFIG.lstm_dim
    step = OnednnStep()
    for lengths in (LENGTHS, np.array([2, 1]), np.concatenate([LENGTHS, LENGTHS + 3])):
        plan = PackPlan.build(lengths)
        x = torch.randn(2, plan.n_tokens, p)
        state = (torch.randn(2, len(lengths), p) * 0.2, torch.randn(2, len(lengths), d) * 0.4)
        want = run_layer(layer, plan, x, state, reference_step)
        got = run_layer(layer, plan, x, state, step)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    assert step._buffer.numel() == plan.n_tokens * 4 * d  # grown to the largest, kept


@pytest.mark.parametrize("name", sorted(FAST_CPU_STEPS))
def test_bf16_step_stays_with_fp32_and_the_bf16_reference(name: str) -> None:
    layer, plan, x, state = layer_plan_input(seed=1)
    fp32 = run_layer(layer, plan, x, state, reference_step)[0]
    reference_bf16 = run_layer(layer, plan, x, state, reference_step, torch.bfloat16)[0]
    got = run_layer(layer, plan, x, state, FAST_CPU_STEPS[name](), torch.bfloat16)[0]
    assert got.dtype == torch.float32  # state and outputs stay fp32; only matmuls are bf16
    assert torch.allclose(got, reference_bf16, atol=2e-3)
    cosine = torch.nn.functional.cosine_similarity(got, fp32, dim=-1)
    assert cosine.min() >= 0.999, cosine.min()


@pytest.mark.parametrize("name", sorted(FAST_CPU_STEPS))
def test_whole_model_with_carried_state_matches_the_reference(name: str) -> None:
    """``contextualize`` (2 layers, skip connection, initial state) and the char CNN."""
    torch.manual_seed(0)
    model = BiLM(CONFIG).eval()
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim)
    state = [(torch.randn(2, len(LENGTHS), CONFIG.projection_dim) * 0.2,
              torch.randn(2, len(LENGTHS), CONFIG.lstm_dim) * 0.4) for _ in range(2)]
    ids = torch.randint(1, CONFIG.n_characters, (70, CONFIG.max_chars))
    step = FAST_CPU_STEPS[name]()
    with torch.inference_mode():
        want_layers, want_state = model.contextualize(tokens, plan, state)
        layers, final = model.contextualize(tokens, plan, state, step=step)
        torch.testing.assert_close(model.token_embedding(ids, step), model.token_embedding(ids),
                                   atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layers, want_layers, atol=2e-6, rtol=1e-5)
    for got_hc, want_hc in zip(final, want_state, strict=True):
        for a, b in zip(got_hc, want_hc, strict=True):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


class _NeverCalled:
    """A step the model must not call: it stands for the fused one, which has no backward."""

    def __call__(self, *args: object) -> None:
        raise AssertionError("a fast step ran while autograd was recording")

    def char_cnn_linears(self, *args: object) -> None:
        raise AssertionError("a fast step ran while autograd was recording")


@pytest.mark.parametrize("step", [TorchStep(), OnednnStep(), _NeverCalled()],
                         ids=["torch", "onednn", "never-called"])
def test_training_runs_the_reference_step_whatever_step_is_passed(step: LstmStep) -> None:
    """Autograd always takes the out-of-place reference recurrence (the fast steps have no
    backward); the model falls back to it by itself while autograd records."""
    torch.manual_seed(0)
    model = BiLM(CONFIG)
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim)
    want, _ = model.contextualize(tokens, plan)
    got, _ = model.contextualize(tokens, plan, step=step)
    got.sum().backward()
    assert torch.equal(got, want)
    assert model.layers[0].recurrent_weight.grad is not None
    ids = torch.randint(1, CONFIG.n_characters, (5, CONFIG.max_chars))
    assert torch.equal(model.token_embedding(ids, step), model.token_embedding(ids))


def test_auto_on_the_cpu_is_onednn_and_explicit_names_are_kept() -> None:
    chosen = lstm_steps.choose_step("auto", "cpu")
    assert chosen.name == "onednn" and "oneDNN" in chosen.reason
    assert isinstance(chosen.step, OnednnStep)
    assert lstm_steps.choose_step("reference", "cpu").step is reference_step
    assert isinstance(lstm_steps.choose_step("torch", "cpu").step, TorchStep)
    for name in ("reference", "torch", "onednn"):
        assert lstm_steps.choose_step(name, "cpu").reason == "set explicitly"


def test_auto_without_onednn_takes_the_torch_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lstm_steps, "onednn_unavailable",
                        lambda dtype=torch.float32: "no oneDNN in this build")
    chosen = lstm_steps.choose_step("auto", "cpu")
    assert (chosen.name, chosen.reason) == ("torch", "no oneDNN in this build")


def test_unknown_and_misplaced_steps_are_user_errors() -> None:
    with pytest.raises(ElmoUserError, match="unknown lstm_impl 'cudnn'; use one of auto, "
                                            "reference, torch, onednn, fused"):
        lstm_steps.choose_step("cudnn", "cpu")
    with pytest.raises(ElmoUserError, match="lstm_impl fused cannot run on cpu: the fused "
                                            "Triton LSTM step is for CUDA devices"):
        lstm_steps.choose_step("fused", "cpu")


def test_an_embedder_chooses_once_and_keeps_its_step(tiny_model_dir) -> None:
    """Two embedders on one model run their own steps; the model holds no choice."""
    import elmo_model

    model = elmo_model.load_model_dir(tiny_model_dir, device="cpu").model
    fast = elmo_model.ElmoEmbedder(model, device="cpu", lstm_impl="onednn", cache_size=0)
    plain = elmo_model.ElmoEmbedder(model, device="cpu", lstm_impl="reference", cache_size=0)
    assert isinstance(fast.step, OnednnStep) and plain.step is reference_step
    sentences = [["the", "cat", "sat"], ["a", "dog"]]
    first = fast.embed(sentences)
    plain.embed(sentences)
    assert isinstance(fast.step, OnednnStep)  # untouched by the other embedder
    for a, b in zip(fast.embed(sentences), first, strict=True):
        assert np.array_equal(a, b)
    assert not hasattr(model, "lstm_impl")


def test_one_stream_and_two_equal_streams_give_the_same_layers_and_gradients() -> None:
    """Inference gathers both directions' inputs in one go, training stacks two streams;
    with the same text in both they agree, and so do the gradients through the in-place
    residual."""
    torch.manual_seed(0)
    model = BiLM(CONFIG)
    plan = PackPlan.build(LENGTHS)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim)
    grads = []
    for backward_tokens in (None, "same"):
        model.zero_grad()
        source = tokens.clone().requires_grad_()
        layers, _ = model.contextualize(source, plan, backward_tokens=(
            source if backward_tokens else None))
        (layers * torch.linspace(-1, 1, layers.shape[-1])).sum().backward()
        grads.append((layers.detach(), source.grad, model.layers[1].input_weight.grad.clone()))
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["reference", *sorted(FAST_CPU_STEPS)])
def test_a_step_writes_its_output_into_a_given_buffer(name: str) -> None:
    """``out=``: the buffer the embedder reuses per batch gets bitwise what the step
    returns without it (bf16 too); ``x`` itself is refused (the step still reads it)."""
    layer, plan, x, state = layer_plan_input(seed=2)
    for dtype in (None, torch.bfloat16):
        make = FAST_CPU_STEPS.get(name, lambda: reference_step)
        want = run_layer(layer, plan, x, state, make(), dtype)
        mine = torch.full_like(want[0], float("nan"))
        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.bfloat16,
                                                    enabled=dtype is not None):
            got = layer(x, plan, state[0], state[1], make(), mine)
            assert got[0].data_ptr() == mine.data_ptr()
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b), name
            with pytest.raises(ValueError, match="must not be the input"):
                layer(x, plan, state[0], state[1], make(), x)
            with pytest.raises(ValueError, match=r"out must be float32 \[2, "):
                layer(x, plan, state[0], state[1], make(), mine[:, 1:])


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["reference", *sorted(FAST_CPU_STEPS)])
def test_an_input_held_per_distinct_token_runs_as_its_packed_tensor(
        name: str, dtype: torch.dtype | None) -> None:
    """A ``DistinctInput`` (7 vectors, each packed position of each direction reading one)
    gives what its gathered ``[2, N, P]`` tensor gives: the oneDNN step projects the 7 and
    gathers the products, the others gather the input first."""
    layer, plan, _, state = layer_plan_input(seed=2)
    vectors = torch.randn(7, CONFIG.projection_dim)
    rows = torch.randint(0, 7, (2, plan.n_tokens))
    distinct = DistinctInput(vectors, rows)
    assert distinct.shape == (2, plan.n_tokens, CONFIG.projection_dim)
    assert torch.equal(packed_input(distinct)[1, 5], vectors[rows[1, 5]])
    new_step = FAST_CPU_STEPS.get(name, lambda: reference_step)
    want = run_layer(layer, plan, packed_input(distinct), state, new_step(), dtype)
    got = run_layer(layer, plan, distinct, state, new_step(), dtype)
    for part, a, b in zip(("output", "final h", "final c"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=f"{name} {part}")
