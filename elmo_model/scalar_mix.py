"""ELMo's task-specific mix of biLM layers (Peters et al. 2018, eq. 1):

    ELMo_k = gamma * sum_{j=0..L} softmax(s)_j * h_{k,j}

``s`` are free scalars (softmax-normalised layer weights) and ``gamma`` scales the whole
vector. With ``layer_norm`` each layer is first normalised to zero mean and unit variance
over all of its unmasked values (the paper's remark that layer normalisation can help).

``ScalarMix`` is the trainable torch module; ``layer_mix`` is its numpy twin, used to mix
stored layers on read without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

_EPS = 1e-12


class ScalarMix(nn.Module):
    """``gamma * sum_j softmax(s)_j * h_j`` over ``n_layers`` equally shaped tensors."""

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
    """numpy twin of ``ScalarMix``: ``gamma * sum_j softmax(scalars)_j * layers[j]``.

    ``layers`` is a sequence of ``[..., dim]`` arrays (any float dtype; float16 storage is
    widened to float32 as it is mixed). Returns float32.
    """
    if len(layers) != len(scalars):
        raise ValueError(f"layer_mix got {len(layers)} layers but {len(scalars)} weights")
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
