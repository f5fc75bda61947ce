"""Train (or fine-tune) the biLM as bilm-tf does (Peters et al. 2018, section 3.1).

    forward stream  ──char CNN──> forward LSTM stack  ─┐
                                                        ├─ shared softmax over the word vocabulary
    backward stream ──char CNN──> backward LSTM stack ─┘   (forward predicts the next token,
                                                            backward the previous one)

Data: every training line, cut into words by the model's tokenizer (``--tokenizer``;
recorded in ``options.json`` as the model's declaration, see ``elmo_model.tokenizers``),
becomes ``<S> w1 .. wn </S>``; each epoch shuffles the lines,
concatenates them and cuts the result into ``batch_size`` long streams read in windows
of ``unroll_steps`` tokens (truncated back-propagation). The LSTM state at the end of a
window is carried, detached, into the next one, per stream. The backward LM gets its
own shuffle of the lines, reversed, as bilm-tf's reversed dataset does, so both
directions always continue the text they were reading.

A checkpoint is one ``weights.safetensors`` (biLM + softmax + optimizer moments + carried
state, training state JSON in its metadata) written to a temp file and renamed, so a
kill at any moment leaves the previous checkpoint whole; ``training_state.json`` is a
readable copy. ``options.json`` and ``vocab.txt`` sit beside it. Resuming re-derives the
data position from the step count and seeds every step's randomness from (seed, step),
so an interrupted run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN, token_char_ids
from elmo_model.corpus.split import is_heldout
from elmo_model.errors import ElmoUserError
from elmo_model.model import BiLM, BiLMConfig, LstmState, PackPlan
from elmo_model.tokenizers import (
    DECLARATION_KEY,
    TRAIN_DEFAULT,
    Tokenizer,
    declared_tokenizer,
    get_tokenizer,
    model_tokenizer,
)
from elmo_model.vocab import Vocabulary
from elmo_model.weights import (
    OPTIONS_FILE,
    SAFETENSORS_FILE,
    config_from_options,
    find_weights,
    load_weights,
    options_from_config,
    read_options,
)

VOCAB_FILE = "vocab.txt"
STATE_FILE = "training_state.json"
SOFTMAX_FILE = "softmax.safetensors"
CHECKPOINT_FORMAT = "elmo-store-train-checkpoint"


# ---------------------------------------------------------------- configuration


@dataclass
class TrainParams:
    """The training knobs; stored under ``"training"`` in ``options.json``."""

    batch_size: int = 64  # parallel streams
    unroll_steps: int = 20  # truncated back-propagation window
    n_tokens_vocab: int = 30_000  # softmax vocabulary (without the 3 specials)
    n_negative_samples: int = 2048  # sampled softmax; 0 = full softmax
    dropout: float = 0.1
    optimizer: str = "adam"  # adam | adagrad (bilm-tf's)
    lr: float = 1e-3
    lr_schedule: str = "linear"  # linear decay to lr_final_fraction over the step budget
    lr_final_fraction: float = 0.1
    warmup_steps: int = 100
    clip_norm: float = 5.0
    seed: int = 0
    heldout_percent: float = 1.0
    precision: str = "float32"  # or bfloat16: autocast matmuls, float32 master weights


    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str) -> TrainParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ElmoUserError(f"{source}: unknown training key {unknown[0]!r}; known: "
                                f"{', '.join(sorted(known))}")
        try:
            params = cls(**{k: type(getattr(cls(), k))(v) for k, v in values.items()})
        except (TypeError, ValueError) as error:
            raise ElmoUserError(f"{source}: bad training value ({error})") from None
        if params.optimizer not in ("adam", "adagrad"):
            raise ElmoUserError(f"{source}: training.optimizer must be adam or adagrad")
        if params.precision not in ("float32", "bfloat16"):
            raise ElmoUserError(f"{source}: training.precision must be float32 or bfloat16")
        if params.lr_schedule not in ("constant", "linear"):
            raise ElmoUserError(f"{source}: training.lr_schedule must be constant or linear")
        if min(params.batch_size, params.unroll_steps, params.n_tokens_vocab) < 1:
            raise ElmoUserError(f"{source}: batch_size, unroll_steps, n_tokens_vocab must be >= 1")
        return params


def _options(n_layers: int, dim: int, proj: int, filters: list[list[int]], n_highway: int,
             training: dict[str, Any]) -> dict[str, Any]:
    return {
        "lstm": {"n_layers": n_layers, "dim": dim, "projection_dim": proj, "cell_clip": 3,
                 "proj_clip": 3, "use_skip_connections": True},
        "char_cnn": {"embedding": {"dim": 16}, "filters": filters, "n_highway": n_highway,
                     "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
        "training": training,
    }


_FILTERS_512 = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256]]
_FILTERS_2048 = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]
PRESETS: dict[str, dict[str, Any]] = {
    # fits a 2-core CPU: about 5M parameters, 10 MB in fp16
    "small": _options(2, 1024, 128, _FILTERS_512, 1, {}),
    "medium": _options(2, 2048, 256, _FILTERS_2048[:6], 1, {}),
    # the paper's model (93.6M parameters); bilm-tf's softmax settings
    "standard": _options(2, 4096, 512, _FILTERS_2048, 2,
                         {"n_tokens_vocab": 100_000, "n_negative_samples": 8192}),
}


def resolve_config(spec: str) -> tuple[BiLMConfig, TrainParams]:
    """``small`` / ``medium`` / ``standard`` or a path to an options JSON file."""
    if spec in PRESETS:
        options, source = json.loads(json.dumps(PRESETS[spec])), f"preset {spec}"
    else:
        path = Path(spec)
        if not path.is_file():
            raise ElmoUserError(f"--config {spec!r} is neither a preset ({', '.join(PRESETS)}) "
                                "nor an options file")
        try:
            options = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ElmoUserError(f"{path}: not valid JSON ({error})") from None
        source = str(path)
    return split_options(options, source)


def split_options(options: dict[str, Any], source: str) -> tuple[BiLMConfig, TrainParams]:
    training = options.get("training", {}) if isinstance(options, dict) else {}
    if not isinstance(training, dict):
        raise ElmoUserError(f"{source}: 'training' must be an object")
    params = TrainParams.from_dict(training, source)
    config = config_from_options(options, source)
    extra = {**config.extra, "training": asdict(params)}
    return BiLMConfig(**{**config.__dict__, "extra": extra}), params


# ---------------------------------------------------------------- corpus


@dataclass
class Corpus:
    """Every line as type ids (``<S>`` ... ``</S>``) over all token strings seen.

    The char CNN reads every type, so rare words keep their spelling as input; only the
    softmax target maps them to ``<UNK>`` (``softmax_ids``).
    """

    types: list[str]
    train: list[np.ndarray]
    heldout: list[np.ndarray]
    char_ids: np.ndarray = field(repr=False)  # [n_types, max_chars] int16
    softmax_ids: np.ndarray = field(repr=False)  # [n_types] int64 vocabulary id per type

    @property
    def n_train_tokens(self) -> int:
        return sum(len(x) for x in self.train)


def read_lines(pattern: str) -> Iterator[str]:
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise ElmoUserError(f"no files match {pattern!r}")
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    line = line.strip()
                    if line:
                        yield line
        except UnicodeDecodeError as error:
            raise ElmoUserError(f"{path}: not UTF-8 text ({error})") from None


def load_corpus(pattern: str, params: TrainParams, max_chars: int = 50,
                vocab: Vocabulary | None = None, tokenizer: Tokenizer | None = None
                ) -> tuple[Corpus, Vocabulary]:
    """Tokenize the files (one sequence per line, ``tokenizer`` default
    :data:`~elmo_model.tokenizers.TRAIN_DEFAULT`), split off the held-out lines, and build
    (or reuse) the vocabulary."""
    tokenizer = tokenizer or get_tokenizer(TRAIN_DEFAULT)
    type_ids: dict[str, int] = {BOS_TOKEN: 0, EOS_TOKEN: 1}
    train_tokens: list[list[str]] = []
    train, heldout = [], []
    for line in read_lines(pattern):
        tokens = [token.text for token in tokenizer.tokenize(line)]
        if not tokens:
            continue
        ids = [0] + [type_ids.setdefault(t, len(type_ids)) for t in tokens] + [1]
        if is_heldout(line, params.heldout_percent):
            heldout.append(np.array(ids, dtype=np.int64))
        else:
            train.append(np.array(ids, dtype=np.int64))
            train_tokens.append(tokens)
    if not train:
        raise ElmoUserError(f"{pattern}: no training text (all lines empty or held out)")
    if vocab is None:
        vocab = Vocabulary.build(train_tokens, params.n_tokens_vocab)
    types = list(type_ids)
    char_ids = np.stack([token_char_ids(t, max_chars) for t in types]).astype(np.int16)
    softmax_ids = np.array(vocab.ids(types), dtype=np.int64)
    return Corpus(types, train, heldout, char_ids, softmax_ids), vocab


class StreamBatches:
    """Epoch-deterministic windows: step -> (forward ids, backward ids), each ``[B, U + 1]``.

    Row ``r`` of step ``s`` continues row ``r`` of step ``s - 1`` (state is carried).
    The backward array holds the backward stream in *reading* order (text reversed).
    """

    def __init__(self, corpus: Corpus, params: TrainParams) -> None:
        self.lines = corpus.train
        self.batch_size = params.batch_size
        self.unroll = params.unroll_steps
        self.seed = params.seed
        total = sum(len(x) for x in self.lines)
        self.stream_length = total // self.batch_size
        self.steps_per_epoch = (self.stream_length - 1) // self.unroll
        if self.steps_per_epoch < 1:
            raise ElmoUserError(f"corpus too small: {total} tokens for batch_size "
                                f"{self.batch_size} x unroll_steps {self.unroll}")
        self._epoch = -1
        self._forward = self._backward = np.empty((0, 0), np.int64)

    def _streams(self, epoch: int, direction: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch, direction])
        ids = np.concatenate([self.lines[i] for i in rng.permutation(len(self.lines))])
        if direction == 1:
            ids = ids[::-1]  # each line reversed and the lines in reverse order
        return ids[: self.batch_size * self.stream_length].reshape(self.batch_size, -1)

    def window(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._forward, self._backward = self._streams(epoch, 0), self._streams(epoch, 1)
            self._epoch = epoch
        start = index * self.unroll
        cut = slice(start, start + self.unroll + 1)
        return self._forward[:, cut], self._backward[:, cut]


# ---------------------------------------------------------------- softmax and loss


class Softmax(nn.Module):
    """The word softmax both directions share: ``logits = h W^T + b``."""

    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim).normal_(0, 1 / math.sqrt(dim)))
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 1024
            ) -> torch.Tensor:
        """Per-token negative log-likelihood under the full softmax, ``[N]``, in chunks so
        the ``[N, V]`` logits never exist at once."""
        parts = []
        for start in range(0, hidden.shape[0], chunk):
            logits = F.linear(hidden[start : start + chunk], self.weight, self.bias)
            parts.append(F.cross_entropy(logits.float(), targets[start : start + chunk],
                                         reduction="none"))
        return torch.cat(parts) if parts else hidden.new_zeros(0)

    def sampled_nll(self, hidden: torch.Tensor, targets: torch.Tensor, n_samples: int,
                    generator: torch.Generator) -> torch.Tensor:
        """Sampled softmax (Jean et al. 2015) with a log-uniform proposal shared by the batch.

        The vocabulary is sorted by frequency, so a Zipf-like proposal
        ``Q(k) = log((k + 2) / (k + 1)) / log(V + 1)`` fits it; each logit is corrected by
        ``log`` of its expected sample count, and negatives equal to the target are masked.
        """
        vocab_size = self.weight.shape[0]
        log_range = math.log(vocab_size + 1)
        uniform = torch.rand(n_samples, generator=generator)
        negatives = (torch.exp(uniform * log_range).long() - 1).clamp_(0, vocab_size - 1)

        def log_expected(ids: torch.Tensor) -> torch.Tensor:
            k = ids.to(torch.float64)
            q = (torch.log(k + 2) - torch.log(k + 1)) / log_range
            return torch.log(q * n_samples).to(hidden.dtype)

        true_logits = (hidden * self.weight[targets]).sum(-1) + self.bias[targets]
        true_logits = true_logits - log_expected(targets)
        negative_logits = F.linear(hidden, self.weight[negatives], self.bias[negatives])
        negative_logits = negative_logits - log_expected(negatives)
        negative_logits = negative_logits.masked_fill(targets[:, None] == negatives[None], -1e9)
        logits = torch.cat([true_logits[:, None], negative_logits], dim=1)
        return torch.logsumexp(logits.float(), dim=1) - logits[:, 0].float()


def perplexity(nll_sum: float, n_tokens: int) -> float:
    """``exp`` of the mean negative log-likelihood per predicted token."""
    if n_tokens <= 0:
        return float("nan")
    return math.exp(nll_sum / n_tokens)


# ---------------------------------------------------------------- evaluation


def expand_state(state: LstmState | None, batch_size: int) -> LstmState | None:
    """A single ``(h [2, P], c [2, D])`` per layer -> every sentence starting from it."""
    if state is None:
        return None
    return [(h[:, None].expand(-1, batch_size, -1).contiguous(),
             c[:, None].expand(-1, batch_size, -1).contiguous()) for h, c in state]


@torch.no_grad()
def heldout_perplexity(model: BiLM, softmax: Softmax, corpus: Corpus,
                       lines: list[np.ndarray] | None = None,
                       initial_state: LstmState | None = None,
                       max_batch_tokens: int = 4096) -> dict[str, float]:
    """Per-direction perplexity of the held-out lines, each read on its own (stateless)
    from ``initial_state`` (zeros when None), with the full softmax.

    Forward predicts tokens 1..n (``w1 .. </S>``) from their left context, backward
    tokens 0..n-1 (``<S> .. wn``) from their right context; ``mean`` is ``exp`` of the
    average of the two directions' mean NLLs (bilm-tf's reported number).
    """
    lines = corpus.heldout if lines is None else lines
    was_training = model.training
    model.eval()
    p = model.config.projection_dim
    totals = {"forward": 0.0, "backward": 0.0}
    count = 0
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    batches: list[list[int]] = [[]]
    budget = 0
    for index in order:
        if batches[-1] and budget + len(lines[index]) > max_batch_tokens:
            batches.append([])
            budget = 0
        batches[-1].append(index)
        budget += len(lines[index])
    for batch in batches:
        if not batch:
            continue
        ids = np.concatenate([lines[i] for i in batch])
        lengths = np.array([len(lines[i]) for i in batch])
        plan = PackPlan.build(lengths)
        tokens = _embed_types(model, corpus, ids)
        layers, _ = model.contextualize(tokens, plan, expand_state(initial_state, len(batch)))
        top = layers[-1]
        targets = torch.from_numpy(corpus.softmax_ids[ids])
        ends = np.cumsum(lengths)
        starts = ends - lengths
        is_last = np.zeros(len(ids), bool)
        is_last[ends - 1] = True
        is_first = np.zeros(len(ids), bool)
        is_first[starts] = True
        fwd_rows = torch.from_numpy(np.flatnonzero(~is_last))
        bwd_rows = torch.from_numpy(np.flatnonzero(~is_first))
        totals["forward"] += float(softmax.nll(top[fwd_rows, :p], targets[fwd_rows + 1]).sum())
        totals["backward"] += float(softmax.nll(top[bwd_rows, p:], targets[bwd_rows - 1]).sum())
        count += len(fwd_rows)
    model.train(was_training)
    result = {k: perplexity(v, count) for k, v in totals.items()}
    result["mean"] = (perplexity((totals["forward"] + totals["backward"]) / 2, count)
                      if count else float("nan"))
    result["tokens"] = float(count)
    return result


def _embed_types(model: BiLM, corpus: Corpus, ids: np.ndarray) -> torch.Tensor:
    """Token vectors for type ids, running the char CNN once per distinct type."""
    unique, inverse = np.unique(ids, return_inverse=True)
    chars = torch.from_numpy(corpus.char_ids[unique].astype(np.int64))
    return model.token_embedding(chars)[torch.from_numpy(inverse.reshape(-1))]


# ---------------------------------------------------------------- checkpoints


@dataclass
class TrainState:
    step: int = 0
    tokens_seen: int = 0  # training tokens predicted (both directions count once each)
    wall_seconds: float = 0.0
    total_steps: int | None = None  # the lr schedule's horizon, fixed at the first run
    history: list[dict[str, Any]] = field(default_factory=list)
    init_from: str | None = None
    corpus: str = ""
    command: str = ""
    resumes: list[dict[str, Any]] = field(default_factory=list)  # step and command of each


def _optimizer_tensors(optimizer: torch.optim.Optimizer, names: dict[int, str]
                       ) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            tensor = value if torch.is_tensor(value) else torch.tensor(float(value))
            tensors[f"optimizer.{names[id(param)]}.{key}"] = tensor.detach().float().contiguous()
    return tensors


def _restore_optimizer(optimizer: torch.optim.Optimizer, named: dict[str, nn.Parameter],
                       tensors: dict[str, torch.Tensor]) -> None:
    for key, value in tensors.items():
        if not key.startswith("optimizer."):
            continue
        name, slot = key[len("optimizer."):].rsplit(".", 1)
        if name not in named:
            continue
        param = named[name]
        if slot == "step":
            optimizer.state[param][slot] = value.reshape(())
        else:
            optimizer.state[param][slot] = value.to(param.dtype).reshape(param.shape)


def save_checkpoint(out: Path, model: BiLM, softmax: Softmax, optimizer: torch.optim.Optimizer,
                    carried: LstmState, state: TrainState) -> None:
    """One safetensors file, written to a temp name and renamed: always whole on disk."""
    from safetensors.torch import save_file

    named = _named_parameters(model, softmax)
    names = {id(p): n for n, p in named.items()}
    tensors = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    tensors.update({f"softmax.{k}": v.detach().float().contiguous()
                    for k, v in softmax.state_dict().items()})
    tensors.update(_optimizer_tensors(optimizer, names))
    for layer, (h, c) in enumerate(carried):
        tensors[f"carry.h.{layer}"] = h.detach().contiguous()
        tensors[f"carry.c.{layer}"] = c.detach().contiguous()
    state_json = json.dumps(asdict(state))
    temp = out / (SAFETENSORS_FILE + ".tmp")
    save_file(tensors, str(temp), metadata={"format": CHECKPOINT_FORMAT, "step": str(state.step),
                                            "training_state": state_json})
    _fsync(temp)
    os.replace(temp, out / SAFETENSORS_FILE)
    _write_atomic(out / STATE_FILE, json.dumps(asdict(state), indent=2) + "\n")


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text, encoding="utf-8")
    _fsync(temp)
    os.replace(temp, path)


def read_checkpoint(out: Path) -> tuple[dict[str, torch.Tensor], TrainState] | None:
    """The last whole checkpoint in ``out``, or None when there is none to resume."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = out / SAFETENSORS_FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if metadata.get("format") != CHECKPOINT_FORMAT:
        raise ElmoUserError(f"{path}: not a training checkpoint (a plain model?); use --init-from "
                            "to fine-tune it, or a new --out directory")
    state = TrainState(**json.loads(metadata["training_state"]))
    return load_file(str(path)), state


def _named_parameters(model: BiLM, softmax: Softmax) -> dict[str, nn.Parameter]:
    named = dict(model.named_parameters())
    named.update({f"softmax.{k}": v for k, v in softmax.named_parameters()})
    return named


# ---------------------------------------------------------------- initialisation


def load_init_model(source: str) -> tuple[BiLM, Vocabulary | None, dict[str, torch.Tensor]]:
    """``--init-from``: our model or checkpoint directory, or an AllenNLP/bilm-tf directory
    (``options.json`` + ``weights.hdf5``). Returns the model, its vocabulary if it has one,
    and any softmax tensors (kept only together with the vocabulary they index)."""
    path = Path(source)
    if not path.is_dir():
        raise ElmoUserError(f"--init-from {source}: not a directory (expects options.json and "
                            "weights.safetensors or weights.hdf5)")
    options_path = path / OPTIONS_FILE
    config = read_options(options_path)
    weights = find_weights(path)
    model = BiLM(config)
    load_weights(model, weights)
    vocab = Vocabulary.load(path / VOCAB_FILE) if (path / VOCAB_FILE).is_file() else None
    return model, vocab, read_softmax(path) if vocab is not None else {}


def read_softmax(model_dir: Path) -> dict[str, torch.Tensor]:
    """Softmax tensors of a checkpoint (inside its weights) or a packaged model (beside
    them, in ``softmax.safetensors``); empty when there are none."""
    from safetensors.torch import load_file

    for name in (SOFTMAX_FILE, SAFETENSORS_FILE):
        if (model_dir / name).is_file():
            found = {k[len("softmax."):]: v.float()
                     for k, v in load_file(str(model_dir / name)).items()
                     if k.startswith("softmax.")}
            if found:
                return found
    return {}


def package_model(checkpoint_dir: str | Path, out: str | Path,
                  dtype: torch.dtype = torch.float16) -> Path:
    """A shippable model directory from a training checkpoint: ``options.json``,
    ``weights.safetensors`` (biLM only, ``dtype``), ``vocab.txt``, ``softmax.safetensors``
    (for perplexity and fine-tuning) and ``warm_state.safetensors``."""
    from safetensors.torch import save_file

    from elmo_model.embedder import compute_warm_state
    from elmo_model.weights import save_model_dir

    checkpoint_dir, out = Path(checkpoint_dir), Path(out)
    model, softmax, vocab, _ = load_trained(checkpoint_dir)
    save_model_dir(model, out, dtype=dtype)
    # keep the training keys: they document how the model was made
    (out / OPTIONS_FILE).write_text((checkpoint_dir / OPTIONS_FILE).read_text())
    vocab.save(out / VOCAB_FILE)
    save_file({f"softmax.{k}": v.detach().to(dtype).contiguous()
               for k, v in softmax.state_dict().items()}, str(out / SOFTMAX_FILE))
    # the warm state of the weights as shipped (rounded to dtype), not of the fp32 ones
    shipped = BiLM(model.config)
    load_weights(shipped, out / SAFETENSORS_FILE)
    from elmo_model import save_warm_state

    save_warm_state(out, compute_warm_state(shipped.eval()))
    return out


# ---------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    out: Path
    state: TrainState
    last_perplexity: dict[str, float] | None
    stopped_by: str


def _make_optimizer(params: TrainParams, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
    if params.optimizer == "adagrad":
        return torch.optim.Adagrad(parameters, lr=params.lr, initial_accumulator_value=1.0)
    return torch.optim.Adam(parameters, lr=params.lr)


def _lr_factor(params: TrainParams, step: int, total: int | None) -> float:
    warm = min(1.0, (step + 1) / params.warmup_steps) if params.warmup_steps > 0 else 1.0
    if params.lr_schedule == "constant" or not total:
        return warm
    progress = min(1.0, step / max(total, 1))
    return warm * (1.0 - (1.0 - params.lr_final_fraction) * progress)


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
    log: Callable[[str], None] | None = None,
    command: str = "",
    overrides: dict[str, Any] | None = None,
    tokenizer: str | None = None,
) -> TrainResult:
    """Train into ``out``, resuming from its checkpoint when there is one.

    ``tokenizer`` names the tokenizer that cuts lines into words; by default the one the
    ``init_from`` model declares, else the one an options file given as ``config_spec``
    declares, else :data:`~elmo_model.tokenizers.TRAIN_DEFAULT` (``moses``). A resumed run
    keeps its own. It is written into ``options.json``, so the model declares it.

    Stops after ``max_steps`` (total, counted across resumes) or ``max_minutes`` of this
    invocation, whichever comes first, and always writes a final checkpoint.
    ``eval_lines`` limits held-out evaluation at checkpoints to that many lines (the
    final checkpoint evaluates them all).
    """
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    out = Path(out)
    resumed = read_checkpoint(out) if out.is_dir() else None
    init_softmax: dict[str, torch.Tensor] = {}
    vocab: Vocabulary | None = None
    if tokenizer is not None:
        get_tokenizer(tokenizer)  # fail fast on an unknown name, before any work
    if resumed is not None:
        options = json.loads((out / OPTIONS_FILE).read_text())
        config, params = split_options(options, str(out))
        # an explicit --tokenizer equal to the declared one accepts a changed version
        trained_with = declared_tokenizer(options, str(out / OPTIONS_FILE),
                                          check_version=tokenizer is None)
        if tokenizer is not None and tokenizer != trained_with:
            raise ElmoUserError(f"{out} was trained with tokenizer {trained_with}; a resumed run "
                                f"keeps it: drop --tokenizer {tokenizer}, or train into a new "
                                "--out")
        line_tokenizer = get_tokenizer(trained_with)
        vocab = Vocabulary.load(out / VOCAB_FILE)
        model = BiLM(config)
        log(f"resuming {out} from step {resumed[1].step} (its options.json rules; --config, "
            "--init-from and --set apply to new runs only)")
    elif init_from:
        model, vocab, init_softmax = load_init_model(init_from)
        line_tokenizer = get_tokenizer(tokenizer or model_tokenizer(init_from))
        _, params = resolve_config(config_spec)
        config = BiLMConfig(**{**model.config.__dict__,
                               "extra": {**model.config.extra, "training": asdict(params),
                                         DECLARATION_KEY: line_tokenizer.record()}})
        model = _with_config(model, config)
    else:
        config, params = resolve_config(config_spec)
        if tokenizer is None and DECLARATION_KEY in config.extra:
            tokenizer = declared_tokenizer(config.extra, config_spec)
        line_tokenizer = get_tokenizer(tokenizer or TRAIN_DEFAULT)
        declared = {**config.extra, DECLARATION_KEY: line_tokenizer.record()}
        config = BiLMConfig(**{**config.__dict__, "extra": declared})
        torch.manual_seed(params.seed)  # the same seed, the same initial weights
        model = BiLM(config)
    if overrides and resumed is None:
        params = TrainParams.from_dict({**asdict(params), **overrides}, "overrides")
        config = BiLMConfig(**{**config.__dict__,
                               "extra": {**config.extra, "training": asdict(params)}})
        model = _with_config(model, config)

    started = time.perf_counter()
    corpus, vocab = load_corpus(corpus_glob, params, config.max_chars, vocab, line_tokenizer)
    log(f"corpus ({line_tokenizer.name} tokens): {len(corpus.train):,} training lines "
        f"({corpus.n_train_tokens:,} tokens), "
        f"{len(corpus.heldout):,} held out; vocabulary {len(vocab):,}; "
        f"loaded in {time.perf_counter() - started:.1f}s")
    torch.manual_seed(params.seed + 1)
    softmax = Softmax(len(vocab), config.projection_dim)
    if init_softmax and set(init_softmax) == {"weight", "bias"} and \
            init_softmax["weight"].shape == softmax.weight.shape:
        softmax.load_state_dict(init_softmax)
    named = _named_parameters(model, softmax)
    optimizer = _make_optimizer(params, list(named.values()))
    batches = StreamBatches(corpus, params)
    b, u = params.batch_size, params.unroll_steps
    carried: LstmState = model.zero_state(b)

    if resumed is not None:
        tensors, state = resumed
        model.load_state_dict({k: tensors[k] for k in model.state_dict()})
        softmax.load_state_dict({k: tensors[f"softmax.{k}"] for k in softmax.state_dict()})
        _restore_optimizer(optimizer, named, tensors)
        carried = [(tensors[f"carry.h.{i}"], tensors[f"carry.c.{i}"])
                   for i in range(config.n_layers)]
        if max_steps is not None:
            state.total_steps = max_steps  # the decay follows the latest step budget
        state.resumes.append({"step": state.step, "command": command})
    else:
        out.mkdir(parents=True, exist_ok=True)
        state = TrainState(total_steps=max_steps, init_from=init_from, corpus=corpus_glob,
                           command=command)
        _write_atomic(out / OPTIONS_FILE, json.dumps(options_from_config(config), indent=2) + "\n")
        vocab.save(out / VOCAB_FILE)

    plan = PackPlan.build(np.full(b, u))
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if params.precision == "bfloat16"
                else nullcontext())
    generator = torch.Generator()
    model.train()
    session_start = time.perf_counter()
    last_checkpoint = session_start
    last_ppl: dict[str, float] | None = None
    eval_subset = corpus.heldout[:eval_lines] if eval_lines else None
    stopped_by = "max_steps"

    def checkpoint(final: bool) -> None:
        nonlocal last_ppl, last_checkpoint
        state.wall_seconds += time.perf_counter() - last_checkpoint
        last_checkpoint = time.perf_counter()
        if corpus.heldout:
            last_ppl = heldout_perplexity(model, softmax, corpus,
                                          None if final else eval_subset)
            if state.history and state.history[-1]["step"] == state.step:
                state.history.pop()  # the final evaluation supersedes one at the same step
            state.history.append({"step": state.step, "tokens_seen": state.tokens_seen,
                                  "wall_seconds": round(state.wall_seconds, 1),
                                  "heldout_perplexity": last_ppl})
            log(f"step {state.step}: held-out perplexity forward {last_ppl['forward']:.1f} "
                f"backward {last_ppl['backward']:.1f} mean {last_ppl['mean']:.1f}")
        save_checkpoint(out, model, softmax, optimizer, carried, state)
        # evaluation time is not training time; keep the clock honest
        last_checkpoint = time.perf_counter()

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=max_steps, initial=state.step, unit="step", dynamic_ncols=True,
                   mininterval=2.0, file=sys.stderr)
    smoothed_loss: float | None = None
    window_tokens = 0
    window_start = time.perf_counter()
    while True:
        if max_steps is not None and state.step >= max_steps:
            stopped_by = "max_steps"
            break
        if max_minutes is not None and time.perf_counter() - session_start >= max_minutes * 60:
            stopped_by = "max_minutes"
            break
        step = state.step
        torch.manual_seed(params.seed * 1_000_003 + step)  # dropout: reproducible on resume
        generator.manual_seed(params.seed * 1_000_033 + step)
        factor = _lr_factor(params, step, state.total_steps)
        for group in optimizer.param_groups:
            group["lr"] = params.lr * factor

        forward_ids, backward_ids = batches.window(step)
        fwd_in, fwd_next = forward_ids[:, :u], forward_ids[:, 1:]
        # The backward LM reads each canonical window right to left; flip its reading-order
        # window so that right-to-left reading continues the reversed text.
        bwd_in, bwd_next = backward_ids[:, :u][:, ::-1], backward_ids[:, 1:][:, ::-1]
        with autocast:
            all_tokens = _embed_types(model, corpus, np.concatenate([fwd_in.ravel(),
                                                                     bwd_in.ravel()]))
            fwd_tokens, bwd_tokens = all_tokens[: b * u], all_tokens[b * u :]
            layers, final = model.contextualize(fwd_tokens, plan, carried, params.dropout,
                                                backward_tokens=bwd_tokens)
        top = layers[-1].float()
        top = F.dropout(top, params.dropout, True) if params.dropout else top
        p = config.projection_dim
        hidden = torch.cat([top[:, :p], top[:, p:]])
        targets = torch.from_numpy(np.concatenate([
            corpus.softmax_ids[fwd_next.ravel()], corpus.softmax_ids[bwd_next.ravel()]]))
        if params.n_negative_samples and params.n_negative_samples < len(vocab):
            nll = softmax.sampled_nll(hidden, targets, params.n_negative_samples, generator)
        else:
            nll = softmax.nll(hidden, targets, chunk=hidden.shape[0])
        loss = nll.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(named.values()), params.clip_norm)
        optimizer.step()
        carried = [(h.detach().float(), c.detach().float()) for h, c in final]

        state.step += 1
        state.tokens_seen += b * u
        window_tokens += b * u
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"training diverged at step {state.step} (loss {value}); lower "
                               "training.lr or training.clip_norm")
        smoothed_loss = value if smoothed_loss is None else 0.98 * smoothed_loss + 0.02 * value
        if bar is not None:
            bar.update(1)
            if state.step % 10 == 0:
                rate = window_tokens / max(time.perf_counter() - window_start, 1e-9)
                bar.set_postfix(loss=f"{smoothed_loss:.3f}", tok_s=f"{rate:,.0f}",
                                epoch=f"{state.step / batches.steps_per_epoch:.2f}",
                                refresh=False)
                window_tokens, window_start = 0, time.perf_counter()
        due = time.perf_counter() - last_checkpoint >= checkpoint_minutes * 60
        if checkpoint_steps:
            due = state.step % checkpoint_steps == 0
        if due:
            checkpoint(final=False)
    if bar is not None:
        bar.close()
    checkpoint(final=True)
    log(f"stopped ({stopped_by}) at step {state.step}; {state.tokens_seen:,} tokens, "
        f"{state.wall_seconds / 60:.1f} training minutes; checkpoint in {out}")
    return TrainResult(out, state, last_ppl, stopped_by)


def _with_config(model: BiLM, config: BiLMConfig) -> BiLM:
    """The same weights under a config whose ``extra`` changed (the shape must not)."""
    fresh = BiLM(config)
    fresh.load_state_dict(model.state_dict())
    return fresh


def load_trained(out: str | Path) -> tuple[BiLM, Softmax, Vocabulary, TrainState | None]:
    """A checkpoint directory's biLM, softmax and vocabulary (for evaluation and export)."""
    out = Path(out)
    config, _ = split_options(json.loads((out / OPTIONS_FILE).read_text()), str(out))
    vocab = Vocabulary.load(out / VOCAB_FILE)
    model = BiLM(config)
    load_weights(model, out / SAFETENSORS_FILE)
    from safetensors.torch import load_file

    tensors = load_file(str(out / SAFETENSORS_FILE))
    softmax = Softmax(len(vocab), config.projection_dim)
    softmax.load_state_dict({k: tensors[f"softmax.{k}"].float() for k in ("weight", "bias")})
    checkpoint = read_checkpoint(out)
    return model.eval(), softmax.eval(), vocab, checkpoint[1] if checkpoint else None
