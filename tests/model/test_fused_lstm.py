"""The fused Triton LSTM step (``elmo_model.steps.fused_lstm``, ``fused_graphs``) against the
reference step.

Triton's interpreter runs the kernels on CPU tensors, but only when ``TRITON_INTERPRET=1``
is set before triton is imported. So the checks below (``check_*``) run together in one
child Python started with that variable, which reports each one's outcome; this pytest
process never imports triton. The child runs the same kernels, launches and time loops
(packed, and padded as captured in CUDA graphs) that the model runs on a GPU; only the
capture itself needs CUDA. Shapes are small: the interpreter is slow.

On a GPU machine the same checks run on CUDA with the compiled kernels and real graph
capture: ``python tests/model/test_fused_lstm.py tests/fixtures/elmo cuda`` (what
``bench/gpu_checks.sh`` runs; CI has no GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_model.model import BiLM, BiLMConfig, BiLstmLayer, LstmStep, PackPlan, reference_step

# Small on purpose; D = 40 and P = 12 are not powers of two, so column masks matter, and
# clips this low are hit by a fair share of cells and outputs.
CONFIG = BiLMConfig(n_layers=2, lstm_dim=40, projection_dim=12, cell_clip=0.5, proj_clip=0.3,
                    char_embedding_dim=4, filters=((1, 4), (2, 8)), n_highway=1)
LENGTHS = np.array([5, 2, 7, 1, 4, 7])
DEVICE = torch.device("cpu")  # the child's second argument: cuda runs the checks there


def _random_state(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    p, d = CONFIG.projection_dim, CONFIG.lstm_dim
    return ((torch.randn(2, batch, p, generator=generator) * 0.2).to(DEVICE),
            (torch.randn(2, batch, d, generator=generator) * 0.4).to(DEVICE))


def _layer_and_input(lengths: np.ndarray, seed: int = 0) -> tuple[BiLstmLayer, PackPlan,
                                                                   torch.Tensor]:
    torch.manual_seed(seed)
    layer = BiLstmLayer(CONFIG).eval()
    with torch.no_grad():
        layer.bias.normal_(0.0, 0.5)
        layer.projection.mul_(8)  # large enough that the projection clip bites
    plan = PackPlan.build(lengths, DEVICE)
    x = torch.randn(2, plan.n_tokens, CONFIG.projection_dim)
    return layer.to(DEVICE), plan, x.to(DEVICE)


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


# ---- checks run in the interpreter child -------------------------------------------------


def check_interpreter_is_on(fixture_dir: Path) -> None:
    import triton  # noqa: F401  (first import, after the variable was set)
    from triton.runtime.interpreter import InterpretedFunction

    from elmo_model.steps import fused_lstm

    interpreted = isinstance(fused_lstm._gates_cell_kernel, InterpretedFunction)
    if DEVICE.type == "cuda":  # compiled kernels, not the interpreter
        assert os.environ.get("TRITON_INTERPRET") != "1" and not interpreted
        return
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert interpreted


def check_one_step_matches_the_reference_math(fixture_dir: Path) -> None:
    """One fused step, masked and not, against the step written out in torch."""
    from elmo_model.steps.fused_lstm import StepWeights, fused_step

    generator = torch.Generator().manual_seed(1)
    batch, n, p, d = 6, 5, CONFIG.projection_dim, CONFIG.lstm_dim
    rand = lambda *shape: torch.randn(*shape, generator=generator).to(DEVICE)  # noqa: E731
    weights = StepWeights(rand(2, p, 4 * d) * 0.3, rand(2, d, p) * 0.3, rand(2, 4 * d) * 0.5,
                          cell_clip=0.5, proj_clip=0.3)
    pre_all = rand(2, 9, 4 * d)
    pre = pre_all[:, 3 : 3 + n]  # a strided slice, as in the packed loop
    h0, c0 = rand(2, batch, p) * 0.2, rand(2, batch, d) * 0.4
    lengths = torch.tensor([4, 1, 2, 3, 0], dtype=torch.int32, device=DEVICE)
    for masked in (False, True):
        h, c = h0.clone(), c0.clone()
        out = torch.full((2, n, p), float("nan"), device=DEVICE)
        work = [torch.empty(2, n, w, device=DEVICE) for w in (4 * d, d, p)]
        step = 2
        fused_step(weights, pre, h, h, c, out, *work, lengths=lengths if masked else None,
                   step=step)
        gates = torch.bmm(h0[:, :n], weights.w_rec) + pre + weights.bias[:, None]
        i, f, o = (torch.sigmoid(gates[..., k * d : (k + 1) * d]) for k in range(3))
        want_c = (f * c0[:, :n] + i * torch.tanh(gates[..., 3 * d :])).clamp(-0.5, 0.5)
        want_out = torch.bmm(o * torch.tanh(want_c), weights.w_proj).clamp(-0.3, 0.3)
        want_h = want_out
        active = torch.ones(n, dtype=torch.bool, device=DEVICE)
        if masked:  # ended rows keep h and c; their output is padding, never read
            active = lengths > step
            want_c = torch.where(active[None, :, None], want_c, c0[:, :n])
            want_h = torch.where(active[None, :, None], want_out, h0[:, :n])
        torch.testing.assert_close(c[:, :n], want_c, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out[:, active], want_out[:, active], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(h[:, :n], want_h, atol=1e-6, rtol=1e-5)
        assert torch.equal(c[:, n:], c0[:, n:]) and torch.equal(h[:, n:], h0[:, n:])
        assert (want_c.abs() == 0.5).any() and (want_out.abs() == 0.3).any()  # clips hit


def _run_layer(layer: BiLstmLayer, plan: PackPlan, x: torch.Tensor, step: LstmStep,
               seed: int = 5):
    h0, c0 = _random_state(len(plan.lengths), seed)
    with torch.inference_mode():
        return layer(x, plan, h0, c0, step)


def _fused_steps() -> dict[str, LstmStep]:
    """The fused step's two loops: packed, and padded as captured in CUDA graphs (here
    even for ragged batches, which on a GPU would run packed)."""
    from elmo_model.steps.fused_graphs import FusedStep

    graphs = FusedStep()
    graphs.recurrence_graphs(DEVICE).max_padding = float("inf")
    return {"packed": FusedStep(graphs=False), "graphs": graphs}


def check_fp32_loops_match_the_reference_step(fixture_dir: Path) -> None:
    """Packed and padded (graph-shaped) loops within 1e-5 of the reference step; the
    padded loop's shared buffers survive growing to a larger bucket and back."""
    steps = _fused_steps()
    for lengths in (LENGTHS, np.array([3, 9, 1, 2, 8, 8, 4, 5, 6, 2, 1]), LENGTHS[:3]):
        layer, plan, x = _layer_and_input(lengths)
        want = _run_layer(layer, plan, x, reference_step)
        assert (want[2].abs() == CONFIG.cell_clip).any()  # the cell clip is exercised
        assert (want[0].abs() == CONFIG.proj_clip).any()  # and the projection clip
        for loop, step in steps.items():
            got = _run_layer(layer, plan, x, step)
            for name, a, b in zip(("out", "h", "c"), got, want, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"{loop} {name}")
    padded = steps["graphs"].recurrence_graphs(DEVICE)
    assert padded.buffers._flat  # the padded loop ran, not a fallback to the packed one
    assert bool(padded.graphs) == (DEVICE.type == "cuda")  # captured on a GPU only


def check_low_precision_stays_close_to_fp32(fixture_dir: Path) -> None:
    """bf16 and fp16 matmuls (fp32 state and gate math): cosine >= 0.9999 per token."""
    torch.manual_seed(0)
    model = BiLM(CONFIG).eval().to(DEVICE)
    plan = PackPlan.build(LENGTHS, DEVICE)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim).to(DEVICE)
    steps = _fused_steps()
    with torch.inference_mode():
        fp32, _ = model.contextualize(tokens, plan)
        for dtype in (torch.bfloat16, torch.float16):
            for loop, step in steps.items():
                with torch.autocast(DEVICE.type, dtype=dtype):
                    low, state = model.contextualize(tokens, plan, step=step)
                assert low.dtype == torch.float32 and state[0][1].dtype == torch.float32
                cosine = _cosines(low, fp32)
                assert cosine.min() >= 0.9999, (dtype, loop, cosine.min())
    assert steps["graphs"].recurrence_graphs(DEVICE).buffers._flat  # padded ran


def check_model_paths_agree_with_initial_state(fixture_dir: Path) -> None:
    """Whole ``contextualize`` (2 layers, skip connection, carried state) per impl."""
    torch.manual_seed(0)
    model = BiLM(CONFIG).eval().to(DEVICE)
    plan = PackPlan.build(LENGTHS, DEVICE)
    tokens = torch.randn(plan.n_tokens, CONFIG.projection_dim).to(DEVICE)
    state = [_random_state(len(LENGTHS), seed) for seed in range(CONFIG.n_layers)]
    with torch.inference_mode():
        want_layers, want_state = model.contextualize(tokens, plan, state)
        results = {loop: model.contextualize(tokens, plan, state, step=step)
                   for loop, step in _fused_steps().items()}
    for layers, final in results.values():
        torch.testing.assert_close(layers, want_layers, atol=1e-5, rtol=1e-5)
        for got_hc, want_hc in zip(final, want_state, strict=True):
            for a, b in zip(got_hc, want_hc, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def check_bilm_tf_conformance_on_the_fused_paths(fixture_dir: Path) -> None:
    """The bilm-tf fixture's first batches, state carried, through each fused path."""
    import h5py

    import elmo_model

    sentences = json.loads((fixture_dir / "sentences.json").read_text())
    expected = [h5py.File(fixture_dir / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    for loop in ("packed", "graphs"):
        embedder = elmo_model.load(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5",
                                   mode="stateful", device=str(DEVICE), lstm_impl="fused")
        assert embedder.lstm_step == ("fused", "set explicitly")
        embedder.step.graphs = loop == "graphs"  # type: ignore[attr-defined]
        embedder.step.recurrence_graphs(DEVICE).max_padding = float("inf")
        for i in range(2):
            batch = [sentences[k][i].split() for k in range(3)]
            for k, layers in enumerate(embedder.embed(batch)):
                top = layers[-1]
                got = np.stack([top[:, :16], top[:, 16:]])
                want = expected[k][str(i)][...]
                assert np.allclose(got, want, atol=1e-6, rtol=1e-5), (loop, i, k)


def check_same_vectors_alone_and_in_a_batch(fixture_dir: Path) -> None:
    """Stateless embedding through the fused step (graphs where the batch pads well): a
    sentence's vectors do not depend on the batch it came in."""
    import elmo_model

    sentences = [s.split() for s in json.loads((fixture_dir / "sentences.json").read_text())[0]]
    embedder = elmo_model.load(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5",
                               device=str(DEVICE), lstm_impl="fused")
    together = embedder.embed(sentences)
    for sentence, batched in zip(sentences, together, strict=True):
        alone = embedder.embed([sentence])[0]
        assert np.allclose(alone, batched, atol=1e-6, rtol=1e-5), \
            float(np.abs(alone - batched).max())


def check_auto_picks_the_fused_step_on_cuda(fixture_dir: Path) -> None:
    from elmo_model.lstm_steps import choose_step
    from elmo_model.steps.fused_graphs import FusedStep

    chosen = choose_step("auto", "cuda")
    assert (chosen.name, chosen.reason) == ("fused", "CUDA device and triton importable")
    assert isinstance(chosen.step, FusedStep) and chosen.step.graphs
    assert choose_step("auto", "cpu").name == "onednn"  # never the fused step on the CPU


def check_buckets(fixture_dir: Path) -> None:
    from elmo_model.steps.fused_graphs import bucket_size, padded_positions

    assert [bucket_size(n) for n in (1, 8, 9, 15, 17, 33, 100, 4000)] == [
        8, 8, 10, 16, 20, 40, 112, 4096]
    for n in range(1, 5000, 7):  # never below n, never 25% above (past the minimum of 8)
        assert n <= bucket_size(n) <= max(8, 1.25 * n)
    with pytest.raises(ValueError):
        bucket_size(0)
    plan = PackPlan.build(np.array([3, 1, 2]))  # ranks: 3, 2, 1 tokens
    assert plan.batch_sizes == [3, 2, 1]
    assert padded_positions(plan.batch_sizes, 8).tolist() == [0, 1, 2, 8, 9, 16]


def check_graphs_only_for_batches_that_pad_well(fixture_dir: Path) -> None:
    from elmo_model.steps.fused_graphs import RecurrenceGraphs

    graphs = RecurrenceGraphs(DEVICE)
    similar = PackPlan.build(np.full(30, 18) + np.arange(30) % 3)  # 18-20 tokens: 32 x 20
    assert graphs.fits(similar.batch_sizes)
    ragged = PackPlan.build(np.array([300] + [5] * 63))  # 64 x 320 grid for 615 tokens
    assert not graphs.fits(ragged.batch_sizes)
    small = PackPlan.build(np.array([40] + [5] * 31))  # 32 x 40: padded, though 6.6x
    assert graphs.fits(small.batch_sizes)


def check_a_batch_of_mixed_lengths_runs_as_length_groups(fixture_dir: Path) -> None:
    """A batch that does not pad well as a whole runs as groups of one length bucket,
    each padded where it pads well: the same outputs and final state as the reference."""
    from elmo_model.steps.fused_graphs import FusedStep, length_groups

    lengths = np.array([30] * 8 + [7] * 9 + [13, 6])  # buckets 32, 14, 8 (7 and 6)
    assert length_groups(np.sort(lengths)[::-1]) == [(0, 8), (8, 9), (9, 19)]
    step = FusedStep()
    graphs = step.recurrence_graphs(DEVICE)
    graphs.small_grid = 0  # only the padding rule: the whole batch does not pass it
    layer, plan, x = _layer_and_input(lengths)
    assert not graphs.fits(plan.batch_sizes)
    want = _run_layer(layer, plan, x, reference_step)
    got = _run_layer(layer, plan, x, step)
    for name, a, b in zip(("out", "h", "c"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)
    # 8 x 30 and 9 x 7 + 6 pad well (240 of 256 cells, 69 of 80); 13 alone does not
    assert graphs.padded_runs == 2


def check_each_loop_writes_into_a_given_output(fixture_dir: Path) -> None:
    """``out=`` (the embedder's buffer reused per batch): packed, padded and length-group
    loops write bitwise what they return without it."""
    from elmo_model.steps.fused_graphs import FusedStep

    grouped = FusedStep()
    grouped.recurrence_graphs(DEVICE).small_grid = 0  # the mixed lengths below run grouped
    steps = {**_fused_steps(), "groups": grouped}
    for loop, step in steps.items():
        lengths = np.array([30] * 8 + [7] * 9 + [13, 6]) if loop == "groups" else LENGTHS
        layer, plan, x = _layer_and_input(lengths)
        h0, c0 = _random_state(len(lengths), seed=1)
        with torch.inference_mode():
            want = layer(x, plan, h0, c0, step)
            mine = torch.full_like(want[0], float("nan"))
            got = layer(x, plan, h0, c0, step, mine)
        assert got[0].data_ptr() == mine.data_ptr(), loop
        for name, a, b in zip(("out", "h", "c"), got, want, strict=True):
            assert torch.equal(a, b), f"{loop} {name}"


CHECKS: dict[str, Callable[[Path], None]] = {
    name: value for name, value in globals().items() if name.startswith("check_")
}


def _run_checks(fixture_dir: Path) -> dict[str, str]:
    torch.set_num_threads(1)
    outcomes = {}
    for name, check in CHECKS.items():
        try:
            check(fixture_dir)
            outcomes[name] = "ok"
        except Exception:
            outcomes[name] = traceback.format_exc()
    return outcomes


# ---- tests (this process) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def interpreter_outcomes(elmo_fixture_dir: Path) -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    child = subprocess.run(
        [sys.executable, __file__, str(elmo_fixture_dir)], env=env, capture_output=True,
        text=True, timeout=600, cwd=Path(__file__).resolve().parents[2],
    )
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_in_triton_interpreter(interpreter_outcomes: dict[str, str], name: str) -> None:
    assert interpreter_outcomes[name] == "ok", interpreter_outcomes[name]


def test_char_cnn_takes_larger_chunks_on_a_gpu() -> None:
    """Fixed chunk shapes keep token vectors batch independent; a GPU takes big ones (its
    cost is launches per chunk), the CPU small ones (conv outputs stay in cache)."""
    char_cnn = BiLM(CONFIG).char_cnn
    assert char_cnn.chunk_size(torch.device("cpu")) == 64
    assert char_cnn.chunk_size(torch.device("cuda")) == 4096


if __name__ == "__main__":  # the child: python tests/model/test_fused_lstm.py FIXTURE [DEVICE]
    if len(sys.argv) > 2:
        DEVICE = torch.device(sys.argv[2])
    outcomes = _run_checks(Path(sys.argv[1]))
    if DEVICE.type == "cuda":  # by hand on a GPU machine: say what failed, and how
        for name, outcome in outcomes.items():
            print(f"{name}: {outcome}", file=sys.stderr)
    print(json.dumps(outcomes))
    sys.exit(0 if DEVICE.type == "cpu" or set(outcomes.values()) == {"ok"} else 1)
