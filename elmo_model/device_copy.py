"""Quantized layers on their way from the device to the host, and what a caller gets.

On CUDA each batch's int8 values and scales are copied into pinned host buffers on a side
stream, with ``non_blocking`` copies: the copy engine moves them while the compute stream
runs the next batch, and a CUDA event recorded after the copies says when the bytes are
there (``HostBatch.wait``). The device tensors are kept from reuse until the copy ends
(``record_stream``). Pinned buffers come from torch's caching host allocator, so a steady
run reuses the same few blocks instead of pinning new memory per batch.

On the CPU the same calls run with plain host buffers and synchronous copies (torch has no
pinned memory, side streams or events there): the buffers, the copies and the slicing
below are the code a GPU runs; pinning, the stream, the event and ``record_stream`` are
not (they run on a GPU only: tests/pipeline/test_quantize_device.py, BENCHMARKS.md). The
embedder's own CPU int8 path does not copy at all: it quantizes each batch from its
reused packed float buffers straight into the host arrays (``quantize.quantize_int8_packed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class HostBatch:
    """One batch's quantized real-token rows in host memory once ``wait`` returns."""

    values: torch.Tensor  # [L + 1, n, 2P] int8
    scales: torch.Tensor  # [L + 1, n] float32
    done: Any = None  # a CUDA event recorded after the copies; None: copied already

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()
            self.done = None


class HostCopier:
    """Copies device tensors into fresh host buffers without waiting for them (above)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        """A small host array on the device; on CUDA from pinned memory with a
        ``non_blocking`` copy, so the host does not wait for the kernels queued before."""
        tensor = torch.from_numpy(array)
        if not self.cuda:
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def to_host(self, values: torch.Tensor, scales: torch.Tensor) -> HostBatch:
        tensors = (values, scales)
        hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=self.cuda) for t in tensors]
        if not self.cuda:
            for host, tensor in zip(hosts, tensors, strict=True):
                host.copy_(tensor)
            return HostBatch(hosts[0], hosts[1])
        assert self.stream is not None
        # The copies start once the quantizing kernels (on the compute stream) are done.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for host, tensor in zip(hosts, tensors, strict=True):
                host.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        for tensor in tensors:  # not reused by the compute stream before the copy is done
            tensor.record_stream(self.stream)
        return HostBatch(hosts[0], hosts[1], done)


@dataclass
class TypeLayer0:
    """Layer 0 of each distinct token of a call, quantized once per token string rather
    than at every occurrence: layer 0 is context free (the same bytes wherever the token
    stands), and what is stored of it is one row per token type of an item (the types
    file). ``values[i]`` is bytewise the int8 of ``[x; x]`` an occurrence of ``tokens[i]``
    gets (``quantize.TypeQuantizer``)."""

    tokens: list[str]  # the call's distinct tokens, in order of first occurrence
    values: np.ndarray  # [T, 2P] int8
    scales: np.ndarray  # [T] float32

    def rows_of(self, tokens: list[str]) -> np.ndarray:
        """The rows of ``tokens`` (each one of this call's)."""
        index = {token: i for i, token in enumerate(self.tokens)}
        return np.array([index[t] for t in tokens], dtype=np.int64)


@dataclass
class Int8Layers:
    """A call's quantized layers in host memory: per batch one block of rows, and where
    each sentence's rows are. Small to pickle (a few large arrays), so a model worker
    hands it to another process through Ray's object store as is. With ``layer_0`` (the
    CPU's ``submit_int8(..., layer_0_per_type=True)``) the rows hold layers 1..L only
    and layer 0 is there once per token type."""

    values: list[np.ndarray] = field(default_factory=list)  # per batch [L + 1, n, 2P] int8
    scales: list[np.ndarray] = field(default_factory=list)  # per batch [L + 1, n] float32
    where: list[tuple[int, int, int]] = field(default_factory=list)  # per sentence
    layer_0: TypeLayer0 | None = None

    def __len__(self) -> int:
        return len(self.where)

    @property
    def first_layer(self) -> int:
        """The layer the per-token rows start at: 1 when layer 0 is per type, else 0."""
        return 0 if self.layer_0 is None else 1

    def stored_rows(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``lo[i]:hi[i]`` of each sentence ``i``, one after the other: (values
        ``[layers, n, 2P]``, scales ``[layers, n]``). A view when they already lie so in
        one block (the CPU's, when no window overlaps the one before), else a copy."""
        at = np.array([start for _, start, _ in self.where], np.int64)
        begin, end = at + np.asarray(lo, np.int64), at + np.asarray(hi, np.int64)
        if len(self.values) == 1 and len(at) and np.array_equal(begin[1:], end[:-1]):
            return (self.values[0][:, begin[0]:end[-1]], self.scales[0][:, begin[0]:end[-1]])
        parts = [self.sentence(i) for i in range(len(self))]
        if not parts:
            raise ValueError("no sentences")
        return (np.concatenate([v[:, a:b] for (v, _), a, b in zip(parts, lo, hi, strict=True)],
                               axis=1),
                np.concatenate([s[:, a:b] for (_, s), a, b in zip(parts, lo, hi, strict=True)],
                               axis=1))

    def sentence(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Sentence ``i``'s (values ``[L + 1, n, 2P]``, scales ``[L + 1, n]``; from layer
        ``first_layer``), views."""
        batch, start, n = self.where[i]
        return (self.values[batch][:, start:start + n],
                self.scales[batch][:, start:start + n])


class PendingInt8:
    """An ``embed_int8`` call whose copies may still be running: ``result`` waits for
    them. The model can start the next call meanwhile."""

    def __init__(self, batches: list[HostBatch], where: list[tuple[int, int, int]],
                 layer_0: TypeLayer0 | None = None) -> None:
        self.batches, self.where, self.layer_0 = batches, where, layer_0

    def result(self) -> Int8Layers:
        for batch in self.batches:
            batch.wait()
        return Int8Layers([b.values.numpy() for b in self.batches],
                          [b.scales.numpy() for b in self.batches], self.where, self.layer_0)
