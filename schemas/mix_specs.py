"""Named layer mixes: what a mix is, the built-in ones, and the ``_mixes.json`` format.

A mix is ELMo's ``gamma * sum_j w_j * h_j`` (``elmo_model.scalar_mix``, the reference)
with fixed weights:

- ``top``: the top biLSTM layer only; ``average``: all layers equally;
- ``layer:<k>``: layer ``k`` alone (``layer:0`` is the context-free char-CNN layer);
- a stored mix (``_mixes.json`` at the dataset root, e.g. one fitted by ``elmo mix fit``);
- an inline JSON object ``{"weights": [...], "gamma": 1.0, "token_norm": false}``.

``weights`` are the softmax-normalised layer weights (non-negative, summing to 1), so
``top`` is exact (a zero weight, which a finite softmax scalar cannot express). Layers
with weight 0 are never read from disk.

``token_norm`` normalises every token's layer vector to zero mean and unit variance over
its own ``dim`` values before mixing. It is not the paper's ``layer_norm`` (one mean and
variance per layer over all unmasked tokens of a batch, ``ScalarMix(layer_norm=True)``):
on read there is no batch whose statistics would not change with how the rows are cut.
Mix files written before the rename call it ``layer_norm``; that key is still read, with
the per-token meaning it had there.

Nothing here reads or writes files: ``schemas.dataset`` stores mixes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elmo_model.errors import ElmoUserError

MIXES_FILE = "_mixes.json"
MIXES_FORMAT = "elmo-store/mixes"
MIXES_VERSION = 1
BUILTIN_MIXES = ("top", "average", "layer:<k>")
# The per-token normalisation's key in mix files written before it was named token_norm.
LEGACY_TOKEN_NORM_KEY = "layer_norm"
_KEYS = {"weights", "gamma", "token_norm", LEGACY_TOKEN_NORM_KEY, "info"}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Mix:
    """Fixed layer weights (summing to 1), a scale and optional per-token normalisation."""

    name: str
    weights: tuple[float, ...]
    gamma: float = 1.0
    token_norm: bool = False
    info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, dtype=np.float64)
        if w.ndim != 1 or len(w) == 0:
            raise ElmoUserError(f"mix {self.name!r}: weights must be a non-empty list")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ElmoUserError(f"mix {self.name!r}: weights must be finite, >= 0, not all 0")
        if not math.isfinite(self.gamma):
            raise ElmoUserError(f"mix {self.name!r}: gamma must be a finite number")
        # Normalise once so that stored and computed weights agree exactly.
        object.__setattr__(self, "weights", tuple(float(x) for x in w / w.sum()))

    @property
    def n_layers(self) -> int:
        return len(self.weights)

    @property
    def used_layers(self) -> list[int]:
        """Layers with a non-zero weight: the only ones read from disk."""
        return [k for k, w in enumerate(self.weights) if w > 0]

    @property
    def scalars(self) -> list[float]:
        """Softmax scalars giving these weights (``-inf`` for a zero weight)."""
        return [math.log(w) if w > 0 else -math.inf for w in self.weights]

    def same_vectors(self, other: Mix) -> bool:
        """Whether both mixes give the same vectors (names and info aside)."""
        return (self.weights, self.gamma, self.token_norm) == (other.weights, other.gamma,
                                                                other.token_norm)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"weights": list(self.weights), "gamma": self.gamma,
                               "token_norm": self.token_norm}
        if self.info:
            out["info"] = self.info
        return out

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> Mix:
        if not isinstance(data, Mapping) or "weights" not in data:
            raise ElmoUserError(f"mix {name!r}: expected an object with 'weights'")
        unknown = set(data) - _KEYS
        if unknown:
            raise ElmoUserError(f"mix {name!r}: unknown keys {sorted(unknown)}")
        if "token_norm" in data and LEGACY_TOKEN_NORM_KEY in data:
            raise ElmoUserError(f"mix {name!r}: give 'token_norm' only ('layer_norm' is its "
                                "old name)")
        try:
            weights = tuple(float(x) for x in data["weights"])
            gamma = float(data.get("gamma", 1.0))
        except (TypeError, ValueError):
            raise ElmoUserError(f"mix {name!r}: weights and gamma must be numbers") from None
        token_norm = bool(data.get("token_norm", data.get(LEGACY_TOKEN_NORM_KEY, False)))
        return cls(name, weights, gamma, token_norm, dict(data.get("info") or {}))

    def describe(self) -> str:
        ws = ", ".join(f"{w:.3f}" for w in self.weights)
        norm = ", token_norm" if self.token_norm else ""
        return f"{self.name}: weights [{ws}], gamma {self.gamma:.4g}{norm}"


def builtin_mix(name: str, n_layers: int) -> Mix | None:
    """``top`` / ``average`` / ``layer:<k>`` for a model with ``n_layers`` output layers."""
    if n_layers < 1:
        return None
    if name == "top":
        return Mix("top", tuple(float(k == n_layers - 1) for k in range(n_layers)))
    if name == "average":
        return Mix("average", (1.0,) * n_layers)
    match = re.fullmatch(r"layer:(\d+)", name)
    if match:
        k = int(match.group(1))
        if k >= n_layers:
            raise ElmoUserError(f"mix {name!r}: this dataset has layers 0..{n_layers - 1}")
        return Mix(name, tuple(float(j == k) for j in range(n_layers)))
    return None


def check_name(name: str) -> str:
    """A name for a stored mix: not a built-in, filename- and SQL-literal-friendly."""
    if not _NAME_RE.match(name) or name in ("top", "average"):
        raise ElmoUserError(f"bad mix name {name!r}: use letters, digits, '_', '.', '-' "
                            "(not 'top', 'average' or 'layer:<k>')")
    return name


def resolve_mix(spec: str | Mapping[str, Any] | Mix, n_layers: int,
                stored: Mapping[str, Mix] | None = None) -> Mix:
    """A mix from a name, an inline JSON object (dict or text) or a ``Mix``."""
    if isinstance(spec, Mix):
        mix = spec
    elif isinstance(spec, Mapping):
        mix = Mix.from_json(str(spec.get("name", "custom")), {k: v for k, v in spec.items()
                                                               if k != "name"})
    else:
        text = spec.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as error:
                raise ElmoUserError(f"inline mix is not valid JSON: {error}") from None
            mix = Mix.from_json("custom", data)
        else:
            found = builtin_mix(text, n_layers)
            if found is None and stored:
                found = stored.get(text)
            if found is None:
                names = ", ".join([*BUILTIN_MIXES, *sorted(stored or {})])
                raise ElmoUserError(f"unknown mix {text!r}; known: {names}")
            mix = found
    if mix.n_layers != n_layers:
        raise ElmoUserError(f"mix {mix.name!r} has {mix.n_layers} weights but the dataset "
                            f"has {n_layers} layers")
    return mix


def parse_mixes_file(data: Mapping[str, Any], where: str) -> dict[str, Mix]:
    """The mixes of a ``_mixes.json`` document, by name."""
    if data.get("format") != MIXES_FORMAT:
        raise ElmoUserError(f"{where}: not an elmo-store mixes file")
    return {name: Mix.from_json(name, spec) for name, spec in data.get("mixes", {}).items()}


def mixes_file_bytes(mixes: Mapping[str, Mix]) -> bytes:
    """A ``_mixes.json`` document holding ``mixes``."""
    body = {"format": MIXES_FORMAT, "version": MIXES_VERSION,
            "mixes": {name: m.to_json() for name, m in sorted(mixes.items())}}
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()
