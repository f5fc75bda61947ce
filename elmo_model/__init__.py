"""elmo_model: the ELMo biLM, its weight formats, and the embedding API.

    import elmo_model
    embedder = elmo_model.load("models/default")        # a model directory, stateless
    layers = embedder.embed([["The", "cat", "sat", "."]])  # [[L+1, 4, 2P] float32]
    # AllenNLP / bilm-tf files: elmo_model.load("options.json", "weights.hdf5")

Names are imported on first use, so ``from elmo_model.errors import ElmoUserError`` (the
CLI's start-up path) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError

_EXPORTS = {
    "elmo_model.api": ("build_model", "default_model_dir", "load", "load_model_dir",
                       "load_warm_state", "resolve_initial_state", "save_warm_state"),
    "elmo_model.embedder": ("ElmoEmbedder", "StateMode", "TokenCache", "compute_warm_state",
                            "select_device"),
    "elmo_model.model": ("BiLM", "BiLMConfig", "BiLMOutput", "PackPlan"),
    "elmo_model.scalar_mix": ("ScalarMix", "layer_mix"),
    "elmo_model.options_file": ("OPTIONS_FILE", "find_weights", "model_fingerprint"),
    "elmo_model.weights": ("WARM_STATE_FILE", "export_bilm_tf_weights", "load_weights",
                           "read_options", "save_model_dir"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "OPTIONS_FILE",
    "WARM_STATE_FILE",
    "BiLM",
    "BiLMConfig",
    "BiLMOutput",
    "ElmoEmbedder",
    "ElmoUserError",
    "PackPlan",
    "ScalarMix",
    "StateMode",
    "TokenCache",
    "build_model",
    "compute_warm_state",
    "default_model_dir",
    "export_bilm_tf_weights",
    "find_weights",
    "layer_mix",
    "load",
    "load_model_dir",
    "load_warm_state",
    "load_weights",
    "model_fingerprint",
    "read_options",
    "resolve_initial_state",
    "save_model_dir",
    "save_warm_state",
    "select_device",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'elmo_model' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from elmo_model.api import (
        build_model,
        default_model_dir,
        load,
        load_model_dir,
        load_warm_state,
        resolve_initial_state,
        save_warm_state,
    )
    from elmo_model.embedder import (
        ElmoEmbedder,
        StateMode,
        TokenCache,
        compute_warm_state,
        select_device,
    )
    from elmo_model.model import BiLM, BiLMConfig, BiLMOutput, PackPlan
    from elmo_model.options_file import OPTIONS_FILE, find_weights, model_fingerprint
    from elmo_model.scalar_mix import ScalarMix, layer_mix
    from elmo_model.weights import (
        WARM_STATE_FILE,
        export_bilm_tf_weights,
        load_weights,
        read_options,
        save_model_dir,
    )
