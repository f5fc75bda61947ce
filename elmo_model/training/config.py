"""Training settings: the knobs stored under ``"training"`` in ``options.json``, and the
named presets ``elmo train --config`` accepts besides an options file."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError, SettingError
from elmo_model.model import BiLMConfig
from elmo_model.options_file import read_options_json
from elmo_model.weights import config_from_options

TRAINING_KEY = "training"


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
        TRAINING_KEY: training,
    }


_FILTERS_512 = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256]]
_FILTERS_2048 = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]
PRESETS: dict[str, dict[str, Any]] = {
    # sized for a 2-core CPU: about 5M parameters, 10 MB in fp16
    "small": _options(2, 1024, 128, _FILTERS_512, 1, {}),
    "medium": _options(2, 2048, 256, _FILTERS_2048[:6], 1, {}),
    # the paper's model (93.6M parameters); bilm-tf's softmax settings
    "standard": _options(2, 4096, 512, _FILTERS_2048, 2,
                         {"n_tokens_vocab": 100_000, "n_negative_samples": 8192}),
}


def resolve_config(spec: str) -> tuple[BiLMConfig, TrainParams]:
    """``small`` / ``medium`` / ``standard`` or a path to an options JSON file."""
    if spec in PRESETS:
        return split_options(copy.deepcopy(PRESETS[spec]), f"preset {spec}")
    if not Path(spec).is_file():
        raise SettingError("config", lambda name: (
            f"{name('config')} {spec!r} is neither a preset ({', '.join(PRESETS)}) nor an "
            "options file"))
    return split_options(read_options_json(spec), spec)


def split_options(options: dict[str, Any], source: str) -> tuple[BiLMConfig, TrainParams]:
    """The biLM shape and the training knobs of parsed options; the config's ``extra``
    records the knobs in full, so the ``options.json`` written from it documents them."""
    training = options.get(TRAINING_KEY, {}) if isinstance(options, dict) else {}
    if not isinstance(training, dict):
        raise ElmoUserError(f"{source}: 'training' must be an object")
    params = TrainParams.from_dict(training, source)
    return with_params(config_from_options(options, source), params), params


def read_split_options(path: str | Path) -> tuple[BiLMConfig, TrainParams]:
    """:func:`split_options` of an ``options.json`` file (missing or bad: a user error)."""
    return split_options(read_options_json(path), str(path))


def with_params(config: BiLMConfig, params: TrainParams) -> BiLMConfig:
    """``config`` with ``params`` recorded as its training block."""
    return with_extra(config, {TRAINING_KEY: asdict(params)})


def with_extra(config: BiLMConfig, extra: dict[str, Any]) -> BiLMConfig:
    """``config`` with keys added to (or replaced in) its ``extra`` options."""
    return BiLMConfig(**{**config.__dict__, "extra": {**config.extra, **extra}})
