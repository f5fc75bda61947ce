"""Weight I/O: bilm-tf ``options.json`` + ``weights.hdf5``, and our safetensors checkpoints.

Every foreign tensor's shape is checked against what the options imply before it is
copied; a mismatch names the tensor, the expected and the found shape. The bilm-tf
layout (names as ``bilm-tf``'s ``dump_weights`` wrote them, direction 0 forward):

    char_embed                                   [n_characters - 1, E]
    CNN/W_cnn_{k}, CNN/b_cnn_{k}                 [1, width_k, E, n_k], [n_k]
    CNN_high_{k}/W_carry|W_transform             [F, F]   (F = sum of n_k)
    CNN_high_{k}/b_carry|b_transform             [F]
    CNN_proj/W_proj, CNN_proj/b_proj             [F, P], [P]
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0    [2P, 4D]  rows: input, then h_prev
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/B      [4D]      gates i, j, f, o
    RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_P_0  [D, P]
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmo_model.errors import ElmoUserError
from elmo_model.model import BiLM, BiLMConfig
from elmo_model.options_file import (
    OPTIONS_FILE,
    SAFETENSORS_FILE,
    read_options_json,
)

WARM_STATE_FILE = "warm_state.safetensors"

# bilm-tf gate order (i, j, f, o) -> ours (i, f, o, j): blocks taken from TF's order.
_TF_TO_OURS = (0, 2, 3, 1)
_OURS_TO_TF = (0, 3, 1, 2)
_TF_FORGET_BIAS = 1.0


# ---------------------------------------------------------------- options


def config_from_options(options: dict[str, Any], source: str = "options") -> BiLMConfig:
    """A ``BiLMConfig`` from a parsed bilm-tf options dict, with errors naming the key."""

    def need(section: dict[str, Any], key: str, where: str) -> Any:
        if key not in section:
            raise ElmoUserError(f"{source}: missing key {where}.{key}")
        return section[key]

    if not isinstance(options, dict) or "lstm" not in options or "char_cnn" not in options:
        raise ElmoUserError(f"{source}: not ELMo options (needs 'lstm' and 'char_cnn' sections)")
    lstm, cnn = options["lstm"], options["char_cnn"]
    try:
        filters = tuple((int(w), int(n)) for w, n in need(cnn, "filters", "char_cnn"))
        embedding = need(cnn, "embedding", "char_cnn")
        config = BiLMConfig(
            n_layers=int(need(lstm, "n_layers", "lstm")),
            lstm_dim=int(need(lstm, "dim", "lstm")),
            projection_dim=int(need(lstm, "projection_dim", "lstm")),
            cell_clip=float(lstm["cell_clip"]) if lstm.get("cell_clip") else None,
            proj_clip=float(lstm["proj_clip"]) if lstm.get("proj_clip") else None,
            use_skip_connections=bool(lstm.get("use_skip_connections", False)),
            char_embedding_dim=int(need(embedding, "dim", "char_cnn.embedding")),
            filters=filters,
            n_highway=int(need(cnn, "n_highway", "char_cnn")),
            n_characters=int(cnn.get("n_characters", 262)),
            max_chars=int(cnn.get("max_characters_per_token", 50)),
            activation=str(cnn.get("activation", "relu")),
            extra={k: v for k, v in options.items() if k not in ("lstm", "char_cnn")},
        )
    except (TypeError, ValueError) as error:
        raise ElmoUserError(f"{source}: bad value ({error})") from None
    if config.n_characters not in (261, 262):
        raise ElmoUserError(f"{source}: char_cnn.n_characters must be 261 or 262, got "
                            f"{config.n_characters}")
    if config.activation not in ("relu", "tanh"):
        raise ElmoUserError(f"{source}: char_cnn.activation must be relu or tanh, got "
                            f"{config.activation!r}")
    if min(config.n_layers, config.lstm_dim, config.projection_dim, len(filters)) < 1:
        raise ElmoUserError(f"{source}: n_layers, dim, projection_dim and filters must be > 0")
    # bilm-tf models say 261 (without the mask row); we always use 262 rows.
    return BiLMConfig(**{**config.__dict__, "n_characters": 262})


def options_from_config(config: BiLMConfig) -> dict[str, Any]:
    return {
        **config.extra,
        "lstm": {
            "n_layers": config.n_layers,
            "dim": config.lstm_dim,
            "projection_dim": config.projection_dim,
            "cell_clip": config.cell_clip or 0,
            "proj_clip": config.proj_clip or 0,
            "use_skip_connections": config.use_skip_connections,
        },
        "char_cnn": {
            "embedding": {"dim": config.char_embedding_dim},
            "filters": [list(f) for f in config.filters],
            "n_highway": config.n_highway,
            "n_characters": config.n_characters,
            "max_characters_per_token": config.max_chars,
            "activation": config.activation,
        },
    }


def read_options(path: str | Path) -> BiLMConfig:
    return config_from_options(read_options_json(path), str(path))


# ---------------------------------------------------------------- bilm-tf hdf5


def _bilm_tf_tensors(config: BiLMConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor name the bilm-tf layout has for this config, with its shape."""
    e, p, d, f = config.char_embedding_dim, config.projection_dim, config.lstm_dim, config.n_filters
    yield "char_embed", (config.n_characters - 1, e)
    for k, (width, n) in enumerate(config.filters):
        yield f"CNN/W_cnn_{k}", (1, width, e, n)
        yield f"CNN/b_cnn_{k}", (n,)
    for k in range(config.n_highway):
        for part in ("carry", "transform"):
            yield f"CNN_high_{k}/W_{part}", (f, f)
            yield f"CNN_high_{k}/b_{part}", (f,)
    yield "CNN_proj/W_proj", (f, p)
    yield "CNN_proj/b_proj", (p,)
    for direction in range(2):
        for layer in range(config.n_layers):
            cell = _cell_name(direction, layer)
            yield f"{cell}/W_0", (2 * p, 4 * d)
            yield f"{cell}/B", (4 * d,)
            yield f"{cell}/W_P_0", (d, p)


def _cell_name(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def _reorder_gates(array: np.ndarray, blocks: tuple[int, ...]) -> np.ndarray:
    parts = np.split(array, 4, axis=-1)
    return np.concatenate([parts[b] for b in blocks], axis=-1)


def _read_hdf5(path: Path, config: BiLMConfig) -> dict[str, np.ndarray]:
    import h5py

    if not path.is_file():
        raise ElmoUserError(f"weights file not found: {path}")
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise ElmoUserError(f"{path}: not a readable HDF5 file, truncated or corrupt ({error})"
                            ) from None
    arrays: dict[str, np.ndarray] = {}
    with handle:
        for name, expected in _bilm_tf_tensors(config):
            if name not in handle:
                raise ElmoUserError(f"{path}: tensor {name} is missing (do the options match "
                                    "these weights?)")
            found = tuple(handle[name].shape)
            if found != expected:
                raise ElmoUserError(f"{path}: tensor {name} has shape {found}, the options imply "
                                    f"{expected}")
            try:
                arrays[name] = np.asarray(handle[name][...], dtype=np.float32)
            except OSError as error:
                raise ElmoUserError(f"{path}: cannot read tensor {name}, file truncated or "
                                    f"corrupt ({error})") from None
    return arrays


def load_bilm_tf_weights(model: BiLM, path: str | Path) -> None:
    """Copy a bilm-tf ``weights.hdf5`` into ``model`` (shapes checked first, all or nothing)."""
    config = model.config
    arrays = _read_hdf5(Path(path), config)
    p, d = config.projection_dim, config.lstm_dim
    state: dict[str, torch.Tensor] = {}
    char_embed = np.zeros((config.n_characters, config.char_embedding_dim), np.float32)
    char_embed[1:] = arrays["char_embed"]
    state["char_cnn.char_embedding.weight"] = torch.from_numpy(char_embed)
    for k in range(len(config.filters)):
        # TF conv kernel [1, width, E, n] -> torch Conv1d [n, E, width]
        kernel = arrays[f"CNN/W_cnn_{k}"][0].transpose(2, 1, 0)
        state[f"char_cnn.convs.{k}.weight"] = torch.from_numpy(np.ascontiguousarray(kernel))
        state[f"char_cnn.convs.{k}.bias"] = torch.from_numpy(arrays[f"CNN/b_cnn_{k}"])
    for k in range(config.n_highway):
        weight = np.concatenate([arrays[f"CNN_high_{k}/W_transform"].T,
                                 arrays[f"CNN_high_{k}/W_carry"].T])
        bias = np.concatenate([arrays[f"CNN_high_{k}/b_transform"],
                               arrays[f"CNN_high_{k}/b_carry"]])
        state[f"char_cnn.highways.{k}.linear.weight"] = torch.from_numpy(weight)
        state[f"char_cnn.highways.{k}.linear.bias"] = torch.from_numpy(bias)
    state["char_cnn.projection.weight"] = torch.from_numpy(arrays["CNN_proj/W_proj"].T.copy())
    state["char_cnn.projection.bias"] = torch.from_numpy(arrays["CNN_proj/b_proj"])
    for layer in range(config.n_layers):
        cells = [_cell_name(direction, layer) for direction in range(2)]
        kernels = [_reorder_gates(arrays[f"{c}/W_0"], _TF_TO_OURS) for c in cells]
        biases = [_reorder_gates(arrays[f"{c}/B"], _TF_TO_OURS).copy() for c in cells]
        for bias in biases:
            bias[d : 2 * d] += _TF_FORGET_BIAS  # our block 1 is the forget gate
        prefix = f"layers.{layer}"
        state[f"{prefix}.input_weight"] = torch.from_numpy(np.stack([k[:p] for k in kernels]))
        state[f"{prefix}.recurrent_weight"] = torch.from_numpy(np.stack([k[p:] for k in kernels]))
        state[f"{prefix}.bias"] = torch.from_numpy(np.stack(biases))
        state[f"{prefix}.projection"] = torch.from_numpy(
            np.stack([arrays[f"{c}/W_P_0"] for c in cells]))
    _load_checked(model, state, str(path))


def export_bilm_tf_weights(model: BiLM, path: str | Path) -> None:
    """Write ``model`` as a bilm-tf ``weights.hdf5`` (the inverse of the loader)."""
    import h5py

    config = model.config
    d = config.lstm_dim
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    arrays: dict[str, np.ndarray] = {"char_embed": sd["char_cnn.char_embedding.weight"][1:]}
    for k in range(len(config.filters)):
        arrays[f"CNN/W_cnn_{k}"] = sd[f"char_cnn.convs.{k}.weight"].transpose(2, 1, 0)[None]
        arrays[f"CNN/b_cnn_{k}"] = sd[f"char_cnn.convs.{k}.bias"]
    f = config.n_filters
    for k in range(config.n_highway):
        weight = sd[f"char_cnn.highways.{k}.linear.weight"]
        bias = sd[f"char_cnn.highways.{k}.linear.bias"]
        arrays[f"CNN_high_{k}/W_transform"] = weight[:f].T
        arrays[f"CNN_high_{k}/W_carry"] = weight[f:].T
        arrays[f"CNN_high_{k}/b_transform"] = bias[:f]
        arrays[f"CNN_high_{k}/b_carry"] = bias[f:]
    arrays["CNN_proj/W_proj"] = sd["char_cnn.projection.weight"].T
    arrays["CNN_proj/b_proj"] = sd["char_cnn.projection.bias"]
    for layer in range(config.n_layers):
        prefix = f"layers.{layer}"
        for direction in range(2):
            cell = _cell_name(direction, layer)
            kernel = np.concatenate([sd[f"{prefix}.input_weight"][direction],
                                     sd[f"{prefix}.recurrent_weight"][direction]])
            bias = sd[f"{prefix}.bias"][direction].copy()
            bias[d : 2 * d] -= _TF_FORGET_BIAS
            arrays[f"{cell}/W_0"] = _reorder_gates(kernel, _OURS_TO_TF)
            arrays[f"{cell}/B"] = _reorder_gates(bias, _OURS_TO_TF)
            arrays[f"{cell}/W_P_0"] = sd[f"{prefix}.projection"][direction]
    with h5py.File(path, "w") as handle:
        for name, _shape in _bilm_tf_tensors(config):
            handle.create_dataset(name, data=np.ascontiguousarray(arrays[name], dtype=np.float32))


# ---------------------------------------------------------------- safetensors


def save_safetensors(model: BiLM, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(dtype).cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "elmo-store-bilm", "version": "1"})


def load_safetensors_weights(model: BiLM, path: str | Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise ElmoUserError(f"weights file not found: {path}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise ElmoUserError(f"{path}: not a readable safetensors file ({error})") from None
    # Optimiser and softmax tensors may sit beside the biLM in training checkpoints.
    _load_checked(model, {k: v.float() for k, v in tensors.items() if k in model.state_dict()},
                  str(path))


def _load_checked(model: BiLM, state: dict[str, torch.Tensor], source: str) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ElmoUserError(f"{source}: tensor {missing[0]} is missing ({len(missing)} in all); "
                            "do the options match these weights?")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ElmoUserError(f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the "
                                f"options imply {tuple(expected[name].shape)}")
    model.load_state_dict(state)


# ---------------------------------------------------------------- model files


def load_weights(model: BiLM, path: str | Path) -> None:
    """Fill ``model`` from a ``.hdf5`` (bilm-tf) or ``.safetensors`` (ours) file."""
    path = Path(path)
    if path.suffix in (".hdf5", ".h5"):
        load_bilm_tf_weights(model, path)
    elif path.suffix == ".safetensors":
        load_safetensors_weights(model, path)
    else:
        raise ElmoUserError(f"{path}: unknown weights format; use a bilm-tf .hdf5 or a "
                            ".safetensors file (pickled checkpoints are never loaded)")


def save_model_dir(model: BiLM, model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``options.json`` + ``weights.safetensors``; returns the directory."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / OPTIONS_FILE).write_text(json.dumps(options_from_config(model.config), indent=2)
                                          + "\n")
    save_safetensors(model, model_dir / SAFETENSORS_FILE, dtype)
    return model_dir
