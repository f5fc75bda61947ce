"""Where a training run starts: a new model (a preset or an options file), a model to
fine-tune (``--init-from``), or the checkpoint already in ``--out`` (resume)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from elmo_model.errors import SettingError
from elmo_model.model import BiLM, BiLMConfig
from elmo_model.options_file import read_options_json
from elmo_model.tokenizers import (
    DECLARATION_KEY,
    TRAIN_DEFAULT,
    Tokenizer,
    declared_tokenizer,
    get_tokenizer,
    model_tokenizer,
)
from elmo_model.training.checkpoints import VOCAB_FILE, TrainState, read_checkpoint
from elmo_model.training.config import (
    TrainParams,
    resolve_config,
    split_options,
    with_extra,
    with_params,
)
from elmo_model.training.packaging import load_init_model
from elmo_model.vocab import SPECIALS, Vocabulary
from elmo_model.weights import OPTIONS_FILE

Log = Callable[[str], None]


@dataclass
class Start:
    """A run's shape, knobs, weights (CPU), tokenizer and, when it has them, vocabulary,
    softmax tensors and the checkpoint it resumes."""

    config: BiLMConfig
    params: TrainParams
    model: BiLM
    tokenizer: Tokenizer
    vocab: Vocabulary | None = None
    init_softmax: dict[str, torch.Tensor] = field(default_factory=dict)
    resumed: tuple[dict[str, torch.Tensor], TrainState] | None = None
    # fine-tuning with ``--set n_tokens_vocab=N``: a new vocabulary from the corpus, the
    # softmax rows of the words it shares with the old one carried over
    rebuild_vocab: bool = False


def _resumed_start(out: Path, resumed: tuple[dict[str, torch.Tensor], TrainState],
                   tokenizer: str | None, log: Log) -> Start:
    options_path = out / OPTIONS_FILE
    options = read_options_json(options_path)
    config, params = split_options(options, str(options_path))
    # an explicit --tokenizer equal to the declared one accepts a changed version
    trained_with = declared_tokenizer(options, str(options_path),
                                      check_version=tokenizer is None)
    if tokenizer is not None and tokenizer != trained_with:
        raise SettingError("tokenizer", lambda name: (
            f"{out} was trained with tokenizer {trained_with}; a resumed run keeps it: drop "
            f"{name('tokenizer')} {tokenizer}, or train into a new {name('out')}"))
    log(f"resuming {out} from step {resumed[1].step} (its options.json rules; --config, "
        "--init-from and --set apply to new runs only)")
    return Start(config, params, BiLM(config), get_tokenizer(trained_with),
                 Vocabulary.load(out / VOCAB_FILE), resumed=resumed)


def _fine_tune_start(init_from: str, config_spec: str, tokenizer: str | None) -> Start:
    model, vocab, init_softmax = load_init_model(init_from)
    line_tokenizer = get_tokenizer(tokenizer or model_tokenizer(init_from))
    _, params = resolve_config(config_spec)  # the knobs only: the model's shape wins
    if vocab is not None:  # kept (unless --set n_tokens_vocab rebuilds it): record its size
        params = replace(params, n_tokens_vocab=len(vocab) - len(SPECIALS))
    config = with_extra(with_params(model.config, params),
                        {DECLARATION_KEY: line_tokenizer.record()})
    return Start(config, params, _with_config(model, config), line_tokenizer, vocab,
                 init_softmax)


def _new_start(config_spec: str, tokenizer: str | None) -> Start:
    config, params = resolve_config(config_spec)
    if tokenizer is None and DECLARATION_KEY in config.extra:
        tokenizer = declared_tokenizer(config.extra, config_spec)
    line_tokenizer = get_tokenizer(tokenizer or TRAIN_DEFAULT)
    config = with_extra(config, {DECLARATION_KEY: line_tokenizer.record()})
    torch.manual_seed(params.seed)  # the same seed, the same initial weights
    return Start(config, params, BiLM(config), line_tokenizer)


def starting_point(out: Path, config_spec: str, init_from: str | None, tokenizer: str | None,
                   overrides: dict[str, Any] | None, log: Log) -> Start:
    """The checkpoint in ``out`` when there is one (its own options rule), else the
    ``init_from`` model, else a new model of ``config_spec``; ``overrides`` (``--set``)
    apply to new runs only."""
    if tokenizer is not None:
        get_tokenizer(tokenizer)  # fail fast on an unknown name, before any work
    resumed = read_checkpoint(out) if out.is_dir() else None
    if resumed is not None:
        return _resumed_start(out, resumed, tokenizer, log)
    start = (_fine_tune_start(init_from, config_spec, tokenizer) if init_from
             else _new_start(config_spec, tokenizer))
    if overrides:
        start.params = TrainParams.from_dict({**asdict(start.params), **overrides}, "overrides")
        start.config = with_params(start.config, start.params)
        start.model = _with_config(start.model, start.config)
        start.rebuild_vocab = start.vocab is not None and "n_tokens_vocab" in overrides
    return start


def _with_config(model: BiLM, config: BiLMConfig) -> BiLM:
    """The same weights under a config whose ``extra`` changed (the shape must not)."""
    fresh = BiLM(config)
    fresh.load_state_dict(model.state_dict())
    return fresh


