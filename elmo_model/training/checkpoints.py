"""Training checkpoints: save and resume.

A checkpoint is one ``weights.safetensors`` (biLM + softmax + optimizer moments + carried
LSTM state, the training state JSON in its metadata) written to a temp file and renamed,
so a kill at any moment leaves the previous checkpoint whole; ``training_state.json`` is a
readable copy, and ``options.json`` and ``vocab.txt`` sit beside it. Tensors are stored
on the CPU in float32 and read back onto the CPU, then moved to the device the resumed
run trains on, so a run checkpointed on a GPU resumes on a CPU and the other way round.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from elmo_model.errors import ElmoUserError, SettingError
from elmo_model.model import BiLM, LstmState
from elmo_model.training.config import read_split_options
from elmo_model.training.lm_head import Softmax
from elmo_model.vocab import Vocabulary
from elmo_model.weights import OPTIONS_FILE, SAFETENSORS_FILE, load_weights
from schemas.files import write_whole

VOCAB_FILE = "vocab.txt"
STATE_FILE = "training_state.json"
CHECKPOINT_FORMAT = "elmo-store-train-checkpoint"
SOFTMAX_PREFIX = "softmax."
_OPTIMIZER_PREFIX = "optimizer."


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


def named_parameters(model: BiLM, softmax: Softmax) -> dict[str, nn.Parameter]:
    """Every trained parameter under the name its checkpoint tensor has."""
    named = dict(model.named_parameters())
    named.update({f"{SOFTMAX_PREFIX}{k}": v for k, v in softmax.named_parameters()})
    return named


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().float().cpu().contiguous()


def _optimizer_tensors(optimizer: torch.optim.Optimizer, named: dict[str, nn.Parameter]
                       ) -> dict[str, torch.Tensor]:
    names = {id(p): n for n, p in named.items()}
    tensors: dict[str, torch.Tensor] = {}
    for param, state in optimizer.state.items():
        for key, value in state.items():
            tensor = value if torch.is_tensor(value) else torch.tensor(float(value))
            tensors[f"{_OPTIMIZER_PREFIX}{names[id(param)]}.{key}"] = _cpu(tensor)
    return tensors


def _restore_optimizer(optimizer: torch.optim.Optimizer, named: dict[str, nn.Parameter],
                       tensors: dict[str, torch.Tensor]) -> None:
    for key, value in tensors.items():
        if not key.startswith(_OPTIMIZER_PREFIX):
            continue
        name, slot = key[len(_OPTIMIZER_PREFIX):].rsplit(".", 1)
        if name not in named:
            continue
        param = named[name]
        if slot == "step":
            # torch's Adam and Adagrad keep their step count on the CPU (unless capturable)
            optimizer.state[param][slot] = value.reshape(())
        else:
            optimizer.state[param][slot] = value.to(param.device, param.dtype).reshape(param.shape)


def save_checkpoint(out: Path, model: BiLM, softmax: Softmax, optimizer: torch.optim.Optimizer,
                    carried: LstmState, state: TrainState) -> None:
    """One safetensors file, written to a temp name and renamed: always whole on disk."""
    tensors = {k: _cpu(v) for k, v in model.state_dict().items()}
    tensors.update({f"{SOFTMAX_PREFIX}{k}": _cpu(v) for k, v in softmax.state_dict().items()})
    tensors.update(_optimizer_tensors(optimizer, named_parameters(model, softmax)))
    for layer, (h, c) in enumerate(carried):
        tensors[f"carry.h.{layer}"] = _cpu(h)
        tensors[f"carry.c.{layer}"] = _cpu(c)
    metadata = {"format": CHECKPOINT_FORMAT, "step": str(state.step),
                "training_state": json.dumps(asdict(state))}
    write_whole(out / SAFETENSORS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata))
    write_text_whole(out / STATE_FILE, json.dumps(asdict(state), indent=2) + "\n")


def write_text_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` (UTF-8), whole or not at all (``schemas.files.write_whole``)."""
    write_whole(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_checkpoint(out: Path) -> tuple[dict[str, torch.Tensor], TrainState] | None:
    """The last whole checkpoint in ``out`` (tensors on the CPU), or None when there is
    none to resume."""
    path = out / SAFETENSORS_FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if metadata.get("format") != CHECKPOINT_FORMAT:
        raise SettingError("out", lambda name: (
            f"{path}: not a training checkpoint (a plain model?); use {name('init_from')} to "
            f"fine-tune it, or a new {name('out')} directory"))
    state = TrainState(**json.loads(metadata["training_state"]))
    return load_file(str(path), device="cpu"), state


def restore_checkpoint(tensors: dict[str, torch.Tensor], model: BiLM, softmax: Softmax,
                       optimizer: torch.optim.Optimizer) -> LstmState:
    """Load a checkpoint's tensors into the (already placed) model, softmax and optimizer;
    returns the carried LSTM state on the model's device."""
    device = next(model.parameters()).device
    model.load_state_dict({k: tensors[k] for k in model.state_dict()})
    softmax.load_state_dict({k: tensors[f"{SOFTMAX_PREFIX}{k}"] for k in softmax.state_dict()})
    _restore_optimizer(optimizer, named_parameters(model, softmax), tensors)
    return [(tensors[f"carry.h.{i}"].to(device), tensors[f"carry.c.{i}"].to(device))
            for i in range(model.config.n_layers)]


def load_trained(out: str | Path) -> tuple[BiLM, Softmax, Vocabulary, TrainState]:
    """A checkpoint directory's biLM, softmax, vocabulary and training state, on the CPU in
    eval mode (for evaluation, packaging and export)."""
    out = Path(out)
    files = (OPTIONS_FILE, VOCAB_FILE, SAFETENSORS_FILE)
    if not all((out / name).is_file() for name in files):
        raise ElmoUserError(f"{out}: not a training checkpoint (needs {', '.join(files)}); give "
                            "an `elmo train --out` directory")
    config, _ = read_split_options(out / OPTIONS_FILE)
    vocab = Vocabulary.load(out / VOCAB_FILE)
    checkpoint = read_checkpoint(out)
    assert checkpoint is not None  # its file is there
    tensors, state = checkpoint
    model = BiLM(config)
    load_weights(model, out / SAFETENSORS_FILE)  # checks every tensor's name and shape
    softmax = Softmax(len(vocab), config.projection_dim)
    softmax.load_state_dict({k: tensors[f"{SOFTMAX_PREFIX}{k}"] for k in ("weight", "bias")})
    return model.eval(), softmax.eval(), vocab, state
