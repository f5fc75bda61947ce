"""The packed batch layout the biLM's recurrence runs over (see ``model.py``), and how
sentences are grouped into stateless batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PackPlan:
    """Where each real token sits in the packed, length-sorted, time-major layout.

    Tokens are numbered in *canonical* order: sentence after sentence, boundaries
    included. Packed position ``offsets[t] + r`` holds time step ``t`` of the sentence of
    rank ``r`` (by descending length); ``forward_index`` / ``backward_index`` give its
    canonical number read forwards / backwards.
    """

    lengths: np.ndarray  # [B] tokens per sentence, canonical order
    order: np.ndarray  # [B] sentence index of each rank
    batch_sizes: list[int]  # [T] active sentences at each step (non-increasing)
    offsets: list[int]  # [T] packed start of each step
    forward_index: torch.Tensor  # [N] packed -> canonical, forward reading
    backward_index: torch.Tensor  # [N] packed -> canonical, reversed reading

    @classmethod
    def build(cls, lengths: np.ndarray, device: torch.device | str = "cpu") -> PackPlan:
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size == 0 or lengths.min() < 1:
            raise ValueError("every sequence needs at least one token")
        order = np.argsort(-lengths, kind="stable")
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        sorted_lengths = lengths[order]
        batch_sizes = [int((sorted_lengths > t).sum()) for t in range(int(sorted_lengths[0]))]
        offsets = np.concatenate([[0], np.cumsum(batch_sizes)[:-1]]).astype(int).tolist()
        fwd, bwd = [], []
        for t, n in enumerate(batch_sizes):
            rows = order[:n]
            fwd.append(starts[rows] + t)
            bwd.append(starts[rows] + lengths[rows] - 1 - t)
        to_tensor = lambda parts: torch.from_numpy(np.concatenate(parts)).to(device)  # noqa: E731
        return cls(lengths, order, batch_sizes, offsets, to_tensor(fwd), to_tensor(bwd))

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def token_index(self) -> torch.Tensor:
        """``[2, N]``: the canonical token at each packed position, read forwards (row 0)
        and backwards (row 1): ``forward_index`` and ``backward_index`` stacked."""
        return torch.stack([self.forward_index, self.backward_index])

    def packed_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Per token in canonical order, its packed position read forwards and read
        backwards: ``[N]`` int64 each, the inverses of ``forward_index`` and
        ``backward_index``."""
        positions = np.arange(self.n_tokens)
        forward, backward = np.empty_like(positions), np.empty_like(positions)
        forward[self.forward_index.cpu().numpy()] = positions
        backward[self.backward_index.cpu().numpy()] = positions
        return forward, backward


@dataclass
class DistinctInput:
    """A packed layer input ``[2, N, P]`` held once per distinct token: ``vectors`` ``[U,
    P]`` and ``rows`` ``[2, N]``, packed position ``n`` of direction ``k`` reading
    ``vectors[rows[k, n]]``. The first LSTM layer's input in inference: the CPU step
    projects the U vectors once and gathers the products (on austen.txt the median batch
    has 979 distinct tokens in 4,067); other steps read ``packed_input(x)``."""

    vectors: torch.Tensor
    rows: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        return (2, self.rows.shape[1], self.vectors.shape[1])

    @property
    def device(self) -> torch.device:
        return self.vectors.device


LayerInput = torch.Tensor | DistinctInput  # an LSTM layer's input, [2, N, P]


def packed_input(x: LayerInput, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` as a packed ``[2, N, P]`` tensor: a DistinctInput's rows gathered, into
    ``out`` when given; a tensor as it is."""
    if isinstance(x, torch.Tensor):
        return x
    if out is None:
        return x.vectors.index_select(0, x.rows.reshape(-1)).view(x.shape)
    return torch.index_select(x.vectors, 0, x.rows.reshape(-1), out=out.view(-1, x.shape[2])
                              ).view(x.shape)


def stateless_batches(rows: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Sequence indices grouped for stateless batches: sorted by length (similar lengths
    together, little padding), each group within ``max_batch_tokens`` rows (a sequence
    longer than the budget goes alone). Stateless results do not depend on the grouping,
    so any grouping is exact; this one is fast."""
    batches: list[list[int]] = []
    budget = 0
    for index in sorted(range(len(rows)), key=lambda i: rows[i]):
        if not batches or budget + rows[index] > max_batch_tokens:
            batches.append([])
            budget = 0
        batches[-1].append(index)
        budget += rows[index]
    return batches


def float32_out(shape: tuple[int, ...], like: torch.Tensor, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """A float32 ``shape`` on ``like``'s device to write a result into: ``out`` when the
    caller gave one (checked, and not ``like`` itself, which the writer still reads), else
    a new tensor. Inference passes buffers it reuses per batch: a fresh ``[2, N, P]`` per
    layer is new pages under the workers' mmap threshold (two minor faults a token at P =
    512)."""
    if out is None:
        return like.new_empty(shape, dtype=torch.float32)
    if tuple(out.shape) != tuple(shape) or out.dtype != torch.float32 or out.device != like.device:
        raise ValueError(f"out must be float32 {list(shape)} on {like.device}, got {out.dtype} "
                         f"{list(out.shape)} on {out.device}")
    if out.data_ptr() == like.data_ptr():
        raise ValueError("out must not be the input it is computed from")
    return out
