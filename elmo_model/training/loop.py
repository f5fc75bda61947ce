"""The training loop: one step, checkpoints, and when to stop.

Resuming re-derives the data position from the step count and seeds every step's
randomness from (seed, step), so an interrupted run continues exactly as an
uninterrupted one would, on the same device or another.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from elmo_model.embedder import select_device
from elmo_model.model import BiLM, LstmState, PackPlan
from elmo_model.training.checkpoints import (
    VOCAB_FILE,
    TrainState,
    named_parameters,
    restore_checkpoint,
    save_checkpoint,
    write_text_whole,
)
from elmo_model.training.config import TrainParams
from elmo_model.training.data import Corpus, StreamBatches, embed_types, load_corpus
from elmo_model.training.evaluation import heldout_perplexity, spread_sample
from elmo_model.training.lm_head import Softmax, carry_rows
from elmo_model.training.start import Log, Start, starting_point
from elmo_model.vocab import Vocabulary
from elmo_model.weights import OPTIONS_FILE, options_from_config


@dataclass
class TrainResult:
    out: Path
    state: TrainState
    last_perplexity: dict[str, Any] | None
    stopped_by: str  # max_steps | max_minutes
    losses: list[float] = field(default_factory=list)  # this invocation's, one per step


# ---------------------------------------------------------------- the steps


def _make_optimizer(params: TrainParams, parameters: list[torch.nn.Parameter]
                    ) -> torch.optim.Optimizer:
    if params.optimizer == "adagrad":
        return torch.optim.Adagrad(parameters, lr=params.lr, initial_accumulator_value=1.0)
    return torch.optim.Adam(parameters, lr=params.lr)


def _lr_factor(params: TrainParams, step: int, total: int | None) -> float:
    warm = min(1.0, (step + 1) / params.warmup_steps) if params.warmup_steps > 0 else 1.0
    if params.lr_schedule == "constant" or not total:
        return warm
    progress = min(1.0, step / max(total, 1))
    return warm * (1.0 - (1.0 - params.lr_final_fraction) * progress)


@dataclass
class _Trainer:
    """What the steps share: the model and softmax on the training device, the optimizer,
    the data, the LSTM state carried from window to window, and the run's state."""

    out: Path
    params: TrainParams
    device: torch.device
    model: BiLM
    softmax: Softmax
    optimizer: torch.optim.Optimizer
    corpus: Corpus
    batches: StreamBatches
    state: TrainState
    carried: LstmState
    plan: PackPlan  # every step's windows: batch_size rows of unroll_steps tokens
    eval_lines: list[int] | None  # intermediate checkpoints evaluate these held-out lines
    log: Log
    last_perplexity: dict[str, Any] | None = None
    generator: torch.Generator = field(default_factory=torch.Generator)  # CPU: see sampled_nll
    _clock: float = field(default_factory=time.perf_counter)  # training time counted up to

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.params.precision == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _hidden_and_targets(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Both LMs over this step's windows: the top layer's states ``[2 B U, P]``
        (forward rows, then backward) and the words they predict."""
        b, u, p = self.params.batch_size, self.params.unroll_steps, self.softmax.weight.shape[1]
        forward_ids, backward_ids = self.batches.window(step)
        fwd_in, fwd_next = forward_ids[:, :u], forward_ids[:, 1:]
        # The backward LM reads each canonical window right to left; flip its reading-order
        # window so that right-to-left reading continues the reversed text.
        bwd_in, bwd_next = backward_ids[:, :u][:, ::-1], backward_ids[:, 1:][:, ::-1]
        with self._autocast():
            tokens = embed_types(self.model, self.corpus,
                                 np.concatenate([fwd_in.ravel(), bwd_in.ravel()]))
            layers, final = self.model.contextualize(tokens[: b * u], self.plan, self.carried,
                                                     self.params.dropout,
                                                     backward_tokens=tokens[b * u :])
        self.carried = [(h.detach().float(), c.detach().float()) for h, c in final]
        top = layers[-1].float()
        top = F.dropout(top, self.params.dropout, True) if self.params.dropout else top
        targets = np.concatenate([self.corpus.softmax_ids[fwd_next.ravel()],
                                  self.corpus.softmax_ids[bwd_next.ravel()]])
        return torch.cat([top[:, :p], top[:, p:]]), torch.from_numpy(targets).to(self.device)

    def step(self) -> float:
        """One optimizer step; returns its loss."""
        params, step = self.params, self.state.step
        torch.manual_seed(params.seed * 1_000_003 + step)  # dropout: reproducible on resume
        self.generator.manual_seed(params.seed * 1_000_033 + step)
        for group in self.optimizer.param_groups:
            group["lr"] = params.lr * _lr_factor(params, step, self.state.total_steps)
        hidden, targets = self._hidden_and_targets(step)
        loss = self.softmax.loss(hidden, targets, params.n_negative_samples, self.generator)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(parameters, params.clip_norm)
        self.optimizer.step()
        self.state.step += 1
        self.state.tokens_seen += params.batch_size * params.unroll_steps
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"training diverged at step {self.state.step} (loss {value}); "
                               "lower training.lr or training.clip_norm")
        return value

    def checkpoint(self, final: bool) -> None:
        """Evaluate on the held-out lines (all of them when ``final``) and save."""
        state = self.state
        state.wall_seconds += time.perf_counter() - self._clock
        if self.corpus.heldout:
            corpus = self.corpus
            chosen = range(len(corpus.heldout)) if final or self.eval_lines is None \
                else self.eval_lines
            files = [corpus.heldout_files[i] for i in chosen] if corpus.heldout_files else None
            ppl = heldout_perplexity(self.model, self.softmax, corpus,
                                     [corpus.heldout[i] for i in chosen], files=files)
            if state.history and state.history[-1]["step"] == state.step:
                state.history.pop()  # the final evaluation supersedes one at the same step
            state.history.append({"step": state.step, "tokens_seen": state.tokens_seen,
                                  "wall_seconds": round(state.wall_seconds, 1),
                                  "heldout_perplexity": ppl})
            by_file = ", ".join(f"{name.rsplit('.', 1)[0]} {figures['mean']:.1f}"
                                for name, figures in ppl.get("by_file", {}).items())
            self.log(f"step {state.step}: held-out perplexity forward {ppl['forward']:.1f} "
                     f"backward {ppl['backward']:.1f} mean {ppl['mean']:.1f}"
                     + (f" (per file: {by_file})" if len(ppl.get("by_file", {})) > 1 else ""))
            self.last_perplexity = ppl
        save_checkpoint(self.out, self.model, self.softmax, self.optimizer, self.carried, state)
        self._clock = time.perf_counter()  # evaluation time is not training time

    @property
    def final_evaluation_scale(self) -> float:
        """How much longer the final evaluation (every held-out line) takes than one at
        an intermediate checkpoint."""
        if not self.eval_lines:
            return 1.0
        return len(self.corpus.heldout) / len(self.eval_lines)


def _build_trainer(out: Path, start: Start, corpus: Corpus, vocab: Vocabulary,
                   device: torch.device, run: TrainState, eval_lines: int | None,
                   log: Log) -> _Trainer:
    """Place the model and a softmax on ``device``, then restore the checkpoint being
    resumed, or write the new run's ``options.json`` and vocabulary."""
    params, config = start.params, start.config
    torch.manual_seed(params.seed + 1)
    softmax = Softmax(len(vocab), config.projection_dim)
    initial = start.init_softmax
    if set(initial) == {"weight", "bias"} and initial["weight"].shape == softmax.weight.shape:
        softmax.load_state_dict(initial)
    # on the device before the optimizer exists, so its state lives there too
    model, softmax = start.model.to(device).train(), softmax.to(device)
    optimizer = _make_optimizer(params, list(named_parameters(model, softmax).values()))
    if start.resumed is not None:
        tensors, state = start.resumed
        carried = restore_checkpoint(tensors, model, softmax, optimizer)
        if run.total_steps is not None:
            state.total_steps = run.total_steps  # the decay follows the latest step budget
        state.resumes.append({"step": state.step, "command": run.command})
    else:
        out.mkdir(parents=True, exist_ok=True)
        options = json.dumps(options_from_config(config), indent=2) + "\n"
        write_text_whole(out / OPTIONS_FILE, options)
        vocab.save(out / VOCAB_FILE)
        state, carried = run, model.zero_state(params.batch_size, device)
    plan = PackPlan.build(np.full(params.batch_size, params.unroll_steps), device)
    return _Trainer(out, params, device, model, softmax, optimizer, corpus,
                    StreamBatches(corpus, params), state, carried, plan,
                    spread_sample(range(len(corpus.heldout)), eval_lines) if eval_lines
                    else None, log)


class _Progress:
    """The progress bar: steps, smoothed loss, tokens per second, epochs."""

    def __init__(self, enabled: bool, total: int | None, initial: int,
                 steps_per_epoch: int, tokens_per_step: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                            mininterval=2.0, file=sys.stderr)
        self.steps_per_epoch, self.tokens_per_step = steps_per_epoch, tokens_per_step
        self.smoothed_loss: float | None = None
        self.window_tokens, self.window_start = 0, time.perf_counter()

    def update(self, step: int, loss: float) -> None:
        if self.bar is None:
            return
        self.smoothed_loss = (loss if self.smoothed_loss is None
                              else 0.98 * self.smoothed_loss + 0.02 * loss)
        self.window_tokens += self.tokens_per_step
        self.bar.update(1)
        if step % 10 == 0:
            rate = self.window_tokens / max(time.perf_counter() - self.window_start, 1e-9)
            self.bar.set_postfix(loss=f"{self.smoothed_loss:.3f}", tok_s=f"{rate:,.0f}",
                                 epoch=f"{step / self.steps_per_epoch:.2f}", refresh=False)
            self.window_tokens, self.window_start = 0, time.perf_counter()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass
class _Limits:
    """When to stop and when to checkpoint."""

    max_steps: int | None
    deadline: float | None  # perf_counter time by which the invocation should have ended
    checkpoint_minutes: float
    checkpoint_steps: int | None


def _run_steps(trainer: _Trainer, limits: _Limits, progress: _Progress) -> tuple[str, list[float]]:
    """Steps until a limit; returns what stopped them and the loss of each step.

    Against the deadline it keeps room for one more step (the slowest so far) and the
    final checkpoint (the last checkpoint's time, scaled to the full held-out set), and
    it always takes at least one step, so every invocation makes progress.
    """
    losses: list[float] = []
    slowest_step = checkpoint_seconds = 0.0
    last_checkpoint = time.perf_counter()
    while True:
        if limits.max_steps is not None and trainer.state.step >= limits.max_steps:
            return "max_steps", losses
        if limits.deadline is not None and losses and (
                time.perf_counter() + slowest_step + checkpoint_seconds >= limits.deadline):
            return "max_minutes", losses
        began = time.perf_counter()
        losses.append(trainer.step())
        slowest_step = max(slowest_step, time.perf_counter() - began)
        progress.update(trainer.state.step, losses[-1])
        if limits.checkpoint_steps:
            due = trainer.state.step % limits.checkpoint_steps == 0
        else:
            due = time.perf_counter() - last_checkpoint >= limits.checkpoint_minutes * 60
        if due:
            began = time.perf_counter()
            trainer.checkpoint(final=False)
            last_checkpoint = time.perf_counter()
            checkpoint_seconds = (last_checkpoint - began) * trainer.final_evaluation_scale


def _log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def train(
    corpus_glob: str,
    out: str | Path,
    config_spec: str = "small",
    init_from: str | None = None,
    max_steps: int | None = None,
    max_minutes: float | None = None,
    checkpoint_minutes: float = 5.0,
    checkpoint_steps: int | None = None,
    eval_lines: int | None = None,
    progress: bool = True,
    log: Log | None = None,
    command: str = "",
    overrides: dict[str, Any] | None = None,
    tokenizer: str | None = None,
    device: str = "auto",
) -> TrainResult:
    """Train into ``out``, resuming from its checkpoint when there is one.

    ``tokenizer`` names the tokenizer that cuts lines into words; by default the one the
    ``init_from`` model declares, else the one an options file given as ``config_spec``
    declares, else :data:`~elmo_model.tokenizers.TRAIN_DEFAULT` (``moses``). A resumed run
    keeps its own. It is written into ``options.json``, so the model declares it.

    Stops after ``max_steps`` (total, counted across resumes) or, with ``max_minutes``,
    in time for this invocation (corpus loading and the final checkpoint included) to end
    within that many minutes, whichever comes first, and always writes a final
    checkpoint; running the same call again resumes from it. ``eval_lines`` limits
    held-out evaluation at checkpoints to that many lines, spread over the held-out set
    (``spread_sample``; the final checkpoint evaluates them all). ``device``: ``auto``
    (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``; a checkpoint resumes on any
    device.
    """
    started = time.perf_counter()
    log = log or _log_to_stderr
    out = Path(out)
    place = select_device(device)
    start = starting_point(out, config_spec, init_from, tokenizer, overrides, log)
    loading = time.perf_counter()
    corpus, vocab = load_corpus(corpus_glob, start.params, start.config.max_chars,
                                None if start.rebuild_vocab else start.vocab, start.tokenizer,
                                progress=progress)
    if start.vocab is not None and vocab is not start.vocab:
        start.init_softmax = carry_rows(start.init_softmax, start.vocab.words, vocab.words,
                                        start.params.seed) if start.init_softmax else {}
        shared = len(set(start.vocab.words) & set(vocab.words))
        log(f"vocabulary rebuilt from the corpus ({len(vocab):,} words, n_tokens_vocab); "
            f"{shared:,} of them keep the --init-from model's softmax rows")
    log(f"corpus ({start.tokenizer.name} tokens): {len(corpus.train):,} training lines "
        f"({corpus.n_train_tokens:,} tokens), {len(corpus.heldout):,} held out; vocabulary "
        f"{len(vocab):,}; loaded in {time.perf_counter() - loading:.1f}s; training on {place}")
    run = TrainState(total_steps=max_steps, init_from=init_from, corpus=corpus_glob,
                     command=command)
    trainer = _build_trainer(out, start, corpus, vocab, place, run, eval_lines, log)
    limits = _Limits(max_steps, None if max_minutes is None else started + max_minutes * 60,
                     checkpoint_minutes, checkpoint_steps)
    bar = _Progress(progress, max_steps, trainer.state.step, trainer.batches.steps_per_epoch,
                    start.params.batch_size * start.params.unroll_steps)
    try:
        stopped_by, losses = _run_steps(trainer, limits, bar)
    finally:
        bar.close()
    trainer.checkpoint(final=True)
    state = trainer.state
    log(f"stopped ({stopped_by}) at step {state.step}; {state.tokens_seen:,} tokens, "
        f"{state.wall_seconds / 60:.1f} training minutes; checkpoint in {out}")
    return TrainResult(out, state, trainer.last_perplexity, stopped_by, losses)
