"""ELMo's task-specific mix of biLM layers (Peters et al. 2018, eq. 1): the reference.

    ELMo_k = gamma * sum_{j=0..L} softmax(s)_j * h_{k,j}

``h_{k,j}`` is layer ``j`` of the biLM at token ``k`` (``j = 0``: the context-free
char-CNN layer), ``s`` are free scalars (softmax-normalised into the layer weights) and
``gamma`` scales the whole vector. With ``layer_norm`` each layer ``h_{.,j}`` is first
normalised to zero mean and unit variance over all of its unmasked values, one mean and
one variance per layer (the paper's remark that layer normalisation can help; AllenNLP's
``ScalarMix(do_layer_norm=True)``).

``ScalarMix`` is the trainable torch module; ``layer_mix`` computes the same equation in
plain numpy and is the reference the fast readers of stored layers
(``pipeline.lookup.layers.mixes``) are tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

_EPS = 1e-12


class ScalarMix(nn.Module):
    """``gamma * sum_j softmax(s)_j * h_j`` over ``n_layers`` equally shaped tensors.

    ``initial_weights`` are the scalars ``s`` (default all 0: an equal mix); with
    ``trainable=False`` neither ``s`` nor ``gamma`` is learned."""

    def __init__(
        self,
        n_layers: int,
        initial_weights: Sequence[float] | None = None,
        gamma: float = 1.0,
        layer_norm: bool = False,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"ScalarMix needs at least one layer, got n_layers={n_layers}")
        weights = [0.0] * n_layers if initial_weights is None else list(initial_weights)
        if len(weights) != n_layers:
            raise ValueError(f"ScalarMix got {len(weights)} initial weights for "
                             f"{n_layers} layers")
        self.n_layers = n_layers
        self.layer_norm = layer_norm
        self.scalars = nn.Parameter(torch.tensor(weights, dtype=torch.float32),
                                    requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor(float(gamma)), requires_grad=trainable)

    def forward(self, layers: Sequence[torch.Tensor] | torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """layers: ``n_layers`` tensors ``[..., dim]`` (or one stacked ``[n_layers, ..., dim]``);
        mask: ``[...]`` bool, True where a token is (used by ``layer_norm`` only)."""
        if len(layers) != self.n_layers:
            raise ValueError(f"ScalarMix built for {self.n_layers} layers was given {len(layers)}")
        _check_shapes([tuple(layer.shape) for layer in layers], mask)
        if self.layer_norm and mask is None:
            raise ValueError("ScalarMix(layer_norm=True) needs the mask")
        weights = torch.softmax(self.scalars, dim=0)
        total = None
        for weight, layer in zip(weights, layers, strict=True):
            if self.layer_norm:
                layer = _masked_layer_norm(layer, mask)
            term = weight * layer
            total = term if total is None else total + term
        return self.gamma * total


def _masked_layer_norm(layer: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    keep = mask.unsqueeze(-1).to(layer.dtype)
    count = keep.sum() * layer.shape[-1]
    mean = (layer * keep).sum() / count
    var = (((layer - mean) * keep) ** 2).sum() / count
    return (layer - mean) / torch.sqrt(var + _EPS)


def _check_shapes(shapes: Sequence[tuple[int, ...]], mask: Any) -> None:
    """Every layer ``[..., dim]`` of one shape, and a mask, if any, of shape ``[...]``."""
    for j, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise ValueError(f"layer {j} has shape {shape} but layer 0 has {shapes[0]}")
    if mask is not None and tuple(mask.shape) != shapes[0][:-1]:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but the layers' tokens are "
                         f"{shapes[0][:-1]}")


def softmax_weights(scalars: Sequence[float]) -> np.ndarray:
    s = np.asarray(scalars, dtype=np.float64)
    e = np.exp(s - s.max())
    return e / e.sum()


def layer_mix(
    layers: Sequence[np.ndarray] | np.ndarray,
    scalars: Sequence[float],
    gamma: float = 1.0,
    layer_norm: bool = False,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """``gamma * sum_j softmax(scalars)_j * layers[j]`` in numpy: the reference equation.

    ``layers`` is a sequence of ``[..., dim]`` arrays (any float dtype; float16 storage is
    widened to float32 as it is mixed). ``layer_norm`` normalises each layer over the
    tokens where ``mask`` (``[...]`` bool) is True, or over all tokens without a mask.
    Returns float32.
    """
    if len(layers) != len(scalars):
        raise ValueError(f"layer_mix got {len(layers)} layers but {len(scalars)} weights")
    _check_shapes([np.shape(layer) for layer in layers], mask)
    weights = softmax_weights(scalars)
    out: np.ndarray | None = None
    for weight, layer in zip(weights, layers, strict=True):
        layer = np.asarray(layer, dtype=np.float32)
        if layer_norm:
            keep = np.ones(layer.shape[:-1], bool) if mask is None else np.asarray(mask, bool)
            values = layer[keep]
            layer = (layer - values.mean()) / np.sqrt(values.var() + _EPS)
        if out is None:
            out = layer * np.float32(weight)
        else:
            out += layer * np.float32(weight)
    assert out is not None
    return out * np.float32(gamma)
