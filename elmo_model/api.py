"""The loading API behind ``elmo_model.load`` and friends (re-exported lazily by the package)."""

from __future__ import annotations

from pathlib import Path

from elmo_model.embedder import ElmoEmbedder, StateMode, compute_warm_state
from elmo_model.errors import ElmoUserError
from elmo_model.model import BiLM, BiLMConfig
from elmo_model.weights import (
    OPTIONS_FILE,
    WARM_STATE_FILE,
    find_weights,
    load_weights,
    model_fingerprint,
    read_options,
)


def default_model_dir() -> Path:
    """The bundled model shipped in the repository, ``models/default``."""
    return Path(__file__).resolve().parent.parent / "models" / "default"


def build_model(options: str | Path, weights: str | Path) -> BiLM:
    """A ``BiLM`` with the weights loaded (CPU, float32, eval mode)."""
    model = BiLM(read_options(options))
    load_weights(model, weights)
    return model.eval()


def save_warm_state(model_dir: str | Path, state: list) -> Path:
    from safetensors.torch import save_file

    tensors = {}
    for layer, (h, c) in enumerate(state):
        tensors[f"h.{layer}"], tensors[f"c.{layer}"] = h.cpu().contiguous(), c.cpu().contiguous()
    path = Path(model_dir) / WARM_STATE_FILE
    save_file(tensors, str(path))
    return path


def load_warm_state(path: str | Path, config: BiLMConfig) -> list:
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    state = []
    for layer in range(config.n_layers):
        h, c = tensors.get(f"h.{layer}"), tensors.get(f"c.{layer}")
        expected_h, expected_c = (2, config.projection_dim), (2, config.lstm_dim)
        if h is None or c is None or tuple(h.shape) != expected_h or tuple(c.shape) != expected_c:
            raise ElmoUserError(f"{path}: warm state for layer {layer} is missing or not shaped "
                                f"{expected_h} / {expected_c}")
        state.append((h.float(), c.float()))
    return state


def load(
    options: str | Path,
    weights: str | Path,
    mode: StateMode = "stateless",
    device: str = "auto",
    dtype: str = "float32",
    initial_state: str = "zeros",
    cache_size: int = 100_000,
    max_batch_tokens: int = 4096,
    warm_state_path: str | Path | None = None,
) -> ElmoEmbedder:
    """Load ``options.json`` + weights (bilm-tf ``.hdf5`` or ``.safetensors``) for embedding.

    ``initial_state``: ``zeros`` or ``warm`` (stateless mode's starting state; ``warm``
    reads ``warm_state_path`` or computes it from the built-in warm-up text).
    """
    if initial_state not in ("zeros", "warm"):
        raise ElmoUserError(f"unknown initial_state {initial_state!r}; use zeros or warm")
    model = build_model(options, weights)
    warm = None
    if initial_state == "warm":
        if warm_state_path is not None and Path(warm_state_path).is_file():
            warm = load_warm_state(warm_state_path, model.config)
        else:
            warm = compute_warm_state(model)
    return ElmoEmbedder(model, mode=mode, device=device, dtype=dtype, cache_size=cache_size,
                        max_batch_tokens=max_batch_tokens, warm_state=warm,
                        fingerprint=model_fingerprint(options, weights))


def load_model_dir(model_dir: str | Path, **kwargs) -> ElmoEmbedder:
    """``load`` for a directory holding ``options.json`` and ``weights.{safetensors,hdf5}``.

    A ``warm_state.safetensors`` in the directory is used when ``initial_state="warm"``.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ElmoUserError(f"model directory not found: {model_dir}")
    options = model_dir / OPTIONS_FILE
    if not options.is_file():
        raise ElmoUserError(f"{model_dir}: no {OPTIONS_FILE} in the model directory")
    kwargs.setdefault("warm_state_path", model_dir / WARM_STATE_FILE)
    return load(options, find_weights(model_dir), **kwargs)
