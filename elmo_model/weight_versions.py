"""Weights the fast LSTM steps derive (cast, reordered), kept until the weights change.

A module says its weights changed through ``weights_version``, which ``load_state_dict``
raises by itself and in-place edits raise through ``weights_changed()``; the caches key
on it and on each parameter's device and address. See ``DerivedWeights`` for why.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")


def _count_load(module: VersionedWeights, _incompatible_keys: object) -> None:
    module.weights_version += 1


class VersionedWeights(nn.Module):
    """A module whose weights the fast steps derive copies from (cast, reordered).

    ``weights_version`` goes up when ``load_state_dict`` fills the module (a hook) and
    when ``weights_changed()`` is called: code that edits weights in place (an optimizer
    step, a ``mul_`` under ``no_grad``) calls it before a fast step runs on the model
    again. Training itself runs ``reference_step``, which derives nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weights_version = 0
        self.register_load_state_dict_post_hook(_count_load)  # module-level: picklable

    def weights_changed(self) -> None:
        """Declare an in-place edit of this module's weights (or any submodule's)."""
        for module in self.modules():
            if isinstance(module, VersionedWeights):
                module.weights_version += 1


class DerivedWeights:
    """``build()``'s result (weights cast or reordered for a fast step) per module and
    dtype, built again when the module's weights changed; kept while they did not, which
    a CUDA graph reading them by address relies on. One is kept per dtype, so embedders
    in float32 and bfloat16 can share a model without rebuilding.

    The key is public state: ``weights_version`` (loads and declared edits) and each
    parameter's device and ``data_ptr`` (``.to()``, replaced tensors). torch's version
    counter (``p._version``) would see in-place edits by itself, but it is private and
    inference tensors have none; a checksum would read every weight (hundreds of MB) at
    each call. So in-place edits are declared: training runs the reference step, which
    derives nothing, and its held-out evaluation declares the optimizer's edits first.
    The entries live beside the module, not on it: a oneDNN reordered weight cannot be
    pickled, and a model must stay picklable and copyable.
    """

    def __init__(self) -> None:
        self._entries: weakref.WeakKeyDictionary[nn.Module, dict[torch.dtype, tuple]] = (
            weakref.WeakKeyDictionary())

    def get(self, module: VersionedWeights, dtype: torch.dtype, build: Callable[[], T]) -> T:
        key = (module.weights_version,
               tuple((p.device, p.data_ptr()) for p in module.parameters()))
        by_dtype = self._entries.setdefault(module, {})
        cached = by_dtype.get(dtype)
        if cached is None or cached[0] != key:
            cached = (key, build())
            by_dtype[dtype] = cached
        return cached[1]
