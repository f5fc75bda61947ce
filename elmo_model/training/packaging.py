"""Models in and out of training: the ``--init-from`` starting point, and a shippable
model directory made from a checkpoint (``elmo model package``)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from elmo_model.api import save_warm_state
from elmo_model.embedder import compute_warm_state
from elmo_model.errors import SettingError
from elmo_model.model import BiLM
from elmo_model.options_file import OPTIONS_FILE, SAFETENSORS_FILE, find_weights
from elmo_model.training.checkpoints import SOFTMAX_PREFIX, VOCAB_FILE, load_trained
from elmo_model.vocab import Vocabulary
from elmo_model.weights import load_weights, read_options, save_model_dir

SOFTMAX_FILE = "softmax.safetensors"


def load_init_model(source: str) -> tuple[BiLM, Vocabulary | None, dict[str, torch.Tensor]]:
    """``--init-from``: our model or checkpoint directory, or an AllenNLP/bilm-tf directory
    (``options.json`` + ``weights.hdf5``). Returns the model (CPU), its vocabulary if it
    has one, and any softmax tensors (kept only together with the vocabulary they index)."""
    path = Path(source)
    if not path.is_dir():
        raise SettingError("init_from", lambda name: (
            f"{name('init_from')} {source}: not a directory (expects options.json and "
            "weights.safetensors or weights.hdf5)"))
    model = BiLM(read_options(path / OPTIONS_FILE))
    load_weights(model, find_weights(path))
    vocab = Vocabulary.load(path / VOCAB_FILE) if (path / VOCAB_FILE).is_file() else None
    return model, vocab, read_softmax(path) if vocab is not None else {}


def _average_into(model: BiLM, softmax: torch.nn.Module, vocab: Vocabulary,
                  others: list[Path]) -> None:
    """Replace ``model``'s and ``softmax``'s parameters by their mean with those of the
    checkpoints in ``others``, which must be of the same shape and vocabulary."""
    sums = {**{f"m.{k}": v.double() for k, v in model.state_dict().items()},
            **{f"s.{k}": v.double() for k, v in softmax.state_dict().items()}}
    for other in others:
        other_model, other_softmax, other_vocab, _ = load_trained(other)
        if other_vocab.words != vocab.words or other_model.config != model.config:
            raise SettingError("average_with", lambda name, other=other: (
                f"{name('average_with')} {other}: another model shape or vocabulary than the "
                "checkpoint packaged; average checkpoints of one run"))
        for prefix, module in (("m.", other_model), ("s.", other_softmax)):
            for k, v in module.state_dict().items():
                sums[prefix + k] += v.double()
    count = len(others) + 1
    for prefix, module in (("m.", model), ("s.", softmax)):
        module.load_state_dict({k[len(prefix):]: (v / count).float()
                                for k, v in sums.items() if k.startswith(prefix)})


def read_softmax(model_dir: Path) -> dict[str, torch.Tensor]:
    """Softmax tensors (float32, CPU) of a checkpoint (inside its weights) or a packaged
    model (beside them, in ``softmax.safetensors``); empty when there are none."""
    for name in (SOFTMAX_FILE, SAFETENSORS_FILE):
        if (model_dir / name).is_file():
            found = {k[len(SOFTMAX_PREFIX):]: v.float()
                     for k, v in load_file(str(model_dir / name), device="cpu").items()
                     if k.startswith(SOFTMAX_PREFIX)}
            if found:
                return found
    return {}


def package_model(checkpoint_dir: str | Path, out: str | Path,
                  dtype: torch.dtype = torch.float16,
                  average_with: Sequence[str | Path] = ()) -> Path:
    """A shippable model directory from a training checkpoint: ``options.json``,
    ``weights.safetensors`` (biLM only, ``dtype``), ``vocab.txt``, ``softmax.safetensors``
    (for perplexity and fine-tuning) and ``warm_state.safetensors``.

    ``average_with``: earlier checkpoints (copies of the same run) whose weights are
    averaged with ``checkpoint_dir``'s, parameter by parameter, as checkpoint averaging
    does; late in a run the average of a few checkpoints is usually a better model than
    any one of them, whose last steps followed the last few batches."""
    checkpoint_dir, out = Path(checkpoint_dir), Path(out)
    model, softmax, vocab, _ = load_trained(checkpoint_dir)
    if average_with:
        _average_into(model, softmax, vocab, [Path(d) for d in average_with])
    save_model_dir(model, out, dtype=dtype)
    # keep the training keys: they document how the model was made
    shutil.copyfile(checkpoint_dir / OPTIONS_FILE, out / OPTIONS_FILE)
    vocab.save(out / VOCAB_FILE)
    save_file({f"{SOFTMAX_PREFIX}{k}": v.detach().to(dtype).contiguous()
               for k, v in softmax.state_dict().items()}, str(out / SOFTMAX_FILE))
    # the warm state of the weights as shipped (rounded to dtype), not of the fp32 ones
    shipped = BiLM(model.config)
    load_weights(shipped, out / SAFETENSORS_FILE)
    save_warm_state(out, compute_warm_state(shipped.eval()))
    return out
