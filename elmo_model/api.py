"""The loading API behind ``elmo_model.load`` and friends (re-exported lazily by the package)."""

from __future__ import annotations

from pathlib import Path

from elmo_model.embedder import ElmoEmbedder, StateMode, compute_warm_state
from elmo_model.errors import ElmoUserError
from elmo_model.model import BiLM, BiLMConfig
from elmo_model.options_file import OPTIONS_FILE, model_dir_files, model_fingerprint
from elmo_model.weights import WARM_STATE_FILE, load_weights, read_options


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


def resolve_initial_state(weights: str | Path, initial_state: str = "auto",
                          warm_state_path: str | Path | None = None) -> tuple[str, Path]:
    """``(zeros | warm, warm state file)`` for a model: ``auto`` means warm when a
    ``warm_state.safetensors`` ships beside the weights (or at ``warm_state_path``)."""
    if initial_state not in ("auto", "zeros", "warm"):
        raise ElmoUserError(f"unknown initial_state {initial_state!r}; use auto, zeros or warm")
    path = Path(warm_state_path) if warm_state_path else Path(weights).parent / WARM_STATE_FILE
    if initial_state == "auto":
        initial_state = "warm" if path.is_file() else "zeros"
    return initial_state, path


def load(
    options: str | Path,
    weights: str | Path | None = None,
    mode: StateMode = "stateless",
    device: str = "auto",
    dtype: str = "float32",
    initial_state: str = "auto",
    cache_size: int = 100_000,
    max_batch_tokens: int = 4096,
    warm_state_path: str | Path | None = None,
    lstm_impl: str = "auto",
) -> ElmoEmbedder:
    """Load a model for embedding: a model directory, as the CLI's ``--model DIR`` takes
    (``load("models/default")``), or ``options.json`` + weights (bilm-tf ``.hdf5`` or
    ``.safetensors``): ``load("options.json", "weights.hdf5")``.

    ``initial_state`` is the LSTM state every stateless sentence starts from:
    ``zeros``; ``warm`` (the state after a fixed warm-up text, read from
    ``warm_state_path`` or ``warm_state.safetensors`` beside the weights, else computed);
    or ``auto`` (default): ``warm`` when such a file ships with the model, else ``zeros``.
    The original models were trained with carried state, and on the default model the
    warm start gave held-out perplexity 88.0 against 107.5 from zeros (MODEL_CARD.md).
    The chosen start is ``embedder.initial_state``.

    ``lstm_impl``: ``auto`` (the fused Triton step on CUDA when triton imports; on the CPU
    the oneDNN step, whose matmuls run on weights reordered once; else the in-place torch
    step), ``reference``, ``torch``, ``onednn`` or ``fused`` (``lstm_steps.py``); the step
    in use and why is ``embedder.lstm_step``.
    """
    settings = {"mode": mode, "device": device, "dtype": dtype, "initial_state": initial_state,
                "cache_size": cache_size, "max_batch_tokens": max_batch_tokens,
                "warm_state_path": warm_state_path, "lstm_impl": lstm_impl}
    if weights is None:
        if Path(options).is_file():
            raise ElmoUserError(f"{options} is a file: pass its weights too, "
                                "load(options, weights), or the model directory")
        return load_model_dir(options, **settings)
    if Path(options).is_dir():
        raise ElmoUserError(f"{options} is a directory: load(directory) takes no weights "
                            "argument; to pick weights, pass options.json and the weights file")
    initial_state, warm_path = resolve_initial_state(weights, initial_state, warm_state_path)
    model = build_model(options, weights)
    warm = None
    if initial_state == "warm":
        warm = (load_warm_state(warm_path, model.config) if warm_path.is_file()
                else compute_warm_state(model))
    return ElmoEmbedder(model, mode=mode, device=device, dtype=dtype, cache_size=cache_size,
                        max_batch_tokens=max_batch_tokens, warm_state=warm,
                        fingerprint=model_fingerprint(options, weights), lstm_impl=lstm_impl)


def load_model_dir(model_dir: str | Path, **kwargs) -> ElmoEmbedder:
    """``load`` for a directory holding ``options.json`` and ``weights.{safetensors,hdf5}``.

    A ``warm_state.safetensors`` in the directory is used by ``initial_state`` auto/warm.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ElmoUserError(f"model directory not found: {model_dir} (a model directory holds "
                            f"{OPTIONS_FILE} and weights.safetensors or weights.hdf5, like "
                            "models/default)")
    options, weights = model_dir_files(model_dir)
    if kwargs.get("warm_state_path") is None:
        kwargs["warm_state_path"] = model_dir / WARM_STATE_FILE
    return load(options, weights, **kwargs)
