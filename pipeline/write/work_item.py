"""Stage 2, on a worker: one work item -> its Parquet files in staging -> a commit record.

    read (fsspec, pipeline/write/read.py) -> tokenize -> windows -> units -> biLM
        -> token rows -> Parquet under _staging/<run_id>/<attempt>/ -> CommitRecord

The same code runs in-process (local executor) and in Ray actors. What goes back to the
driver is a ``CommitRecord``: file names, row counts, sizes and checksums, never
activations. An item's bytes depend only on its input and the settings: windows are cut
into units in document order by a token count, the embedder batches inside a unit by a
token budget over length-sorted sentences, and its token cache returns vectors bitwise
equal to fresh ones (the char CNN runs in fixed-shape chunks), so a retried item, a
resumed run or a run with another actor count writes the same bytes.

``ItemWorker.process`` is safe to call from several threads at once: the model runs
under a lock, so one item's reading, tokenizing and writing overlap another's model
time (Ray actors run two items at a time; see pipeline/write/executors.py). The model may
also live in another process (a GPU worker serving several item workers,
pipeline/write/stages.py): the worker then asks it for one unit ahead of the one it writes.

With int8 storage the layers are quantized where the model runs (on a GPU, before they
are copied to the host), by the same rule, to the same bytes as quantizing here
(elmo_model/quantize.py): a dataset does not depend on the device that wrote it.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import json
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import elmo_model
from pipeline.tokenize import Sentence, Token, get_tokenizer, windows
from pipeline.write.config import ModelSpec
from pipeline.write.inputs import DocError, Document, ReadOptions
from pipeline.write.item_files import (
    ItemFiles,
    TokenWriter,
    int8_layer_columns,
    quantized_layer_columns,
    write_small_tables,
)
from pipeline.write.plan import WorkItem
from pipeline.write.read import LineCounter, read_range
from schemas.files import open_fs


@dataclass(frozen=True)
class ItemSettings:
    """Everything a worker needs to turn an item into files (small, picklable)."""

    model: ModelSpec
    tokenizer: str
    out: str
    part: str
    run_id: str
    dtype: str
    n_output_layers: int
    dim: int
    batch_tokens: int
    unit_tokens: int
    compute_dtype: str
    device: str
    max_sentence_tokens: int
    window_overlap: int
    read: ReadOptions
    storage_options: dict | None


@dataclass
class CommitRecord:
    """What a worker reports for one finished attempt at an item (see pipeline/write/commit.py)."""

    item: int
    attempt: str
    files: dict[str, str]  # table -> staged path relative to the dataset root (rows only)
    sizes: dict[str, int]  # table -> bytes
    sha256: dict[str, str]  # table -> hex digest of the file's bytes
    counts: dict[str, int]  # table -> rows
    model_tokens: int  # tokens that went through the model (window overlaps included)
    input_bytes: int
    seconds: float
    worker: dict[str, Any]  # host, pid, Ray node id
    peak_rss: int  # the worker process's peak resident set, bytes


# --------------------------------------------------------------------------- model


# Set only inside ``reuse_models()``: in-process runs then share loaded models.
_MODEL_CACHE: contextvars.ContextVar[dict[tuple, Any] | None] = contextvars.ContextVar(
    "elmo_store_model_cache", default=None)


@contextlib.contextmanager
def reuse_models() -> Iterator[None]:
    """Within this block, in-process (``local``) runs load each model once and reuse it.

    For callers that run many small embeddings in a row (jobs: one per changed file).
    Reuse is safe because an item's vectors do not depend on what the embedder computed
    before (see the module docstring). Ray actors load their own copy.
    """
    token = _MODEL_CACHE.set({})
    try:
        yield
    finally:
        _MODEL_CACHE.reset(token)


def load_embedder(spec: ModelSpec, batch_tokens: int, compute_dtype: str, device: str) -> Any:
    """The biLM on ``device`` (auto/cpu/cuda) computing in ``compute_dtype``; elmo_model
    refuses float16 off CUDA, cuda without a GPU and unreadable weights with a
    user-facing message."""
    cache = _MODEL_CACHE.get()
    key = (spec, batch_tokens, compute_dtype, device)
    if cache is not None and key in cache:
        return cache[key]
    embedder = elmo_model.load(spec.options, spec.weights, mode="stateless", device=device,
                               dtype=compute_dtype, max_batch_tokens=batch_tokens)
    if cache is not None:
        cache[key] = embedder
    return embedder


# --------------------------------------------------------------------------- tokenize


class WindowRow(NamedTuple):
    """One model window of a sentence: its tokens and which of them it stores."""

    doc_id: str
    sent_idx: int
    start: int  # token index of the window's first token in its sentence
    own_start: int  # the tokens this window stores: [own_start, own_end) of the sentence
    own_end: int
    tokens: list[str]
    char_starts: list[int]
    char_ends: list[int]


@dataclass
class ItemContent:
    """An item's small tables and its model windows, in document order."""

    documents: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    sentences: list[dict] = field(default_factory=list)
    windows: list[WindowRow] = field(default_factory=list)


def _pretokenized_sentences(doc: Document) -> list[Sentence]:
    out, offset = [], 0
    for words in doc.pretokenized or []:
        tokens = []
        for word in words:
            tokens.append(Token(word, offset, offset + len(word)))
            offset += len(word) + 1  # joined by one space; sentences by one newline
        out.append(Sentence(tuple(tokens)))
    return out


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


def tokenize_item(docs: Iterator[Document | DocError], settings: ItemSettings) -> ItemContent:
    """Sentences, windows and table rows of an item's documents (errors for the bad ones)."""
    tokenizer = get_tokenizer(settings.tokenizer)
    content = ItemContent()
    for doc in docs:
        if isinstance(doc, DocError):
            content.errors.append({"doc_id": doc.doc_id, "source": doc.source,
                                   "line": doc.line, "reason": doc.reason})
            continue
        sentences = (_pretokenized_sentences(doc) if doc.pretokenized is not None
                     else tokenizer.split_sentences(doc.text))
        if not sentences:
            content.errors.append({"doc_id": doc.doc_id, "source": doc.source,
                                   "line": doc.line, "reason": "no tokens in document"})
            continue
        n_tokens = 0
        for sent_idx, sentence in enumerate(sentences):
            toks = sentence.tokens
            spans = windows(len(toks), settings.max_sentence_tokens, settings.window_overlap)
            content.sentences.append({
                "doc_id": doc.doc_id, "sent_idx": sent_idx,
                "text": doc.text[sentence.start:sentence.end],
                "char_start": sentence.start, "char_end": sentence.end,
                "n_tokens": len(toks), "n_windows": len(spans),
            })
            for w in spans:
                piece = toks[w.start:w.end]
                content.windows.append(WindowRow(
                    doc.doc_id, sent_idx, w.start, w.own_start, w.own_end,
                    [t.text for t in piece], [t.start for t in piece], [t.end for t in piece]))
            n_tokens += len(toks)
        content.documents.append({
            "doc_id": doc.doc_id, "source": doc.source, "line": doc.line,
            "n_sentences": len(sentences), "n_tokens": n_tokens,
            "metadata": _json_or_none(doc.metadata),
        })
    return content


def cut_units(window_rows: list[WindowRow], unit_tokens: int) -> Iterator[list[WindowRow]]:
    """Consecutive windows of about ``unit_tokens`` tokens: one model call each."""
    rows: list[WindowRow] = []
    size = 0
    for row in window_rows:
        if rows and size + len(row.tokens) > unit_tokens:
            yield rows
            rows, size = [], 0
        rows.append(row)
        size += len(row.tokens)
    if rows:
        yield rows


# --------------------------------------------------------------------------- embed


def rows_of_unit(rows: list[WindowRow], layers: Any, n_out: int, dim: int, dtype: str) -> Any:
    """The stored rows of a unit's windows given the model's ``layers``: one float array
    ``[L + 1, n, dim]`` per window (``embed``), or, for int8, ``Int8Layers`` quantized
    where the model ran (``embed_int8``), which become the stored int8 values and scales
    as they are."""
    import numpy as np
    import pyarrow as pa

    from elmo_model.device_copy import Int8Layers
    from schemas.tables import storage_type

    cols = WindowRow(*zip(*rows, strict=True))
    starts, own_start, own_end = (np.array(col, np.int32)
                                  for col in (cols.start, cols.own_start, cols.own_end))
    lo, hi = own_start - starts, own_end - starts
    counts = hi - lo
    doc_ids = np.repeat(np.array(cols.doc_id, dtype=object), counts)
    sent_idx = np.repeat(np.array(cols.sent_idx, np.int32), counts)
    tok_idx = np.concatenate([np.arange(a, b) for a, b in zip(own_start, own_end, strict=True)]
                             ) if len(counts) else np.zeros(0, np.int64)

    def pick(col: tuple) -> list:
        return [v for vals, a, b in zip(col, lo, hi, strict=True) for v in vals[a:b]]

    columns: dict[str, Any] = {
        "doc_id": pa.array(doc_ids, pa.string()),
        "sent_idx": pa.array(sent_idx, pa.int32()),
        "tok_idx": pa.array(tok_idx, pa.int32()),
        "token": pa.array(pick(cols.tokens), pa.string()),
        "char_start": pa.array(pick(cols.char_starts), pa.int32()),
        "char_end": pa.array(pick(cols.char_ends), pa.int32()),
    }
    if isinstance(layers, Int8Layers):  # quantized where the model ran
        columns.update(_int8_columns(layers, lo, hi, n_out, dim))
        return pa.table(columns)
    if dtype == "int8":  # each window quantized where it lies: no float copy of the unit
        columns.update(quantized_layer_columns(layers, lo, hi, n_out, dim))
        return pa.table(columns)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    stacked = np.concatenate([arr[:, a:b] for arr, a, b in zip(layers, lo, hi, strict=True)],
                             axis=1) if layers else np.zeros((n_out, 0, dim), np.float32)
    value_type = storage_type(dtype)
    for k in range(n_out):
        # stacked[k] is a contiguous view: float32 goes to Arrow with no copy
        values = pa.array(stacked[k].astype(np_dtype, copy=False).reshape(-1), value_type)
        columns[f"layer_{k}"] = pa.FixedSizeListArray.from_arrays(values, dim)
    return pa.table(columns)


def _int8_columns(layers: Any, lo: Any, hi: Any, n_out: int, dim: int) -> dict[str, Any]:
    """``layer_k`` (int8 values) and ``layer_k_scale`` of the windows' stored tokens."""
    import numpy as np

    first = layers.first_layer  # 1: layer 0 came per token type (``Int8Layers.layer_0``)
    values, scales = (layers.stored_rows(lo, hi) if len(layers) else
                      (np.zeros((n_out - first, 0, dim), np.int8),
                       np.zeros((n_out - first, 0), np.float32)))
    return int8_layer_columns(values, scales, first)


# --------------------------------------------------------------------------- worker


class ItemProgress:
    """Stored tokens done so far of each item a worker is running, for the driver's
    progress bar: updated per model unit from the item threads, read by the driver (local)
    or by the actor's progress call (Ray) without waiting for an item to finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[int, int] = {}

    @contextlib.contextmanager
    def tracking(self, item: int) -> Iterator[None]:
        """Count ``item`` from 0 while the block runs (a retried item starts again)."""
        with self._lock:
            self._tokens[item] = 0
        try:
            yield
        finally:
            with self._lock:
                self._tokens.pop(item, None)

    def add(self, item: int, tokens: int) -> None:
        with self._lock:
            self._tokens[item] = self._tokens.get(item, 0) + tokens

    def snapshot(self) -> dict[int, int]:
        """Item index -> tokens done, for the items running now."""
        with self._lock:
            return dict(self._tokens)


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def quantizes_on_device(embedder: Any, dtype: str) -> bool:
    """Whether the model quantizes its int8 layers where it ran (``embed_int8``): always for
    int8. On a GPU a quarter of the bytes cross to the host; on the CPU each batch is
    quantized as it comes out of a reused buffer, so no float copy of a unit is made. The
    bytes are the same either way (tests/pipeline/test_quantize_device.py)."""
    return dtype == "int8"


class InProcessModel:
    """The model stage in the item worker's own process: one call at a time (``lock``),
    so one item's reading and writing overlap another item's model call."""

    def __init__(self, embedder: Any, int8: bool) -> None:
        self.embedder, self.int8 = embedder, int8
        self.lock = threading.Lock()
        # On a GPU the next unit is computed while this one is written (its copies to the
        # host overlap); on the CPU, where model and writer share the cores, no unit is
        # held ahead: less memory, the same work.
        self.lookahead = 1 if embedder.device.type == "cuda" else 0

    def submit(self, sentences: list[list[str]]) -> Any:
        with self.lock:
            if self.int8:  # the writer stores layer 0 per token type (the types file)
                return self.embedder.submit_int8(sentences, layer_0_per_type=True)
            return self.embedder.embed(sentences)

    def collect(self, handle: Any) -> Any:
        return handle.result() if self.int8 else handle


class ItemWorker:
    """Turns items into staged files; holds the model stage: by default the model in this
    process (``InProcessModel``), or a model in another process (pipeline/write/stages.py)."""

    def __init__(self, settings: ItemSettings, model: Any = None) -> None:
        self.settings = settings
        self.model: Any = model
        self.lines = LineCounter()
        self.node_id: str | None = None
        self.progress = ItemProgress()

    def load(self) -> None:
        """Load the model now (a bad model fails here, before any item is read)."""
        s = self.settings
        get_tokenizer(s.tokenizer)
        if self.model is None:
            embedder = load_embedder(s.model, s.batch_tokens, s.compute_dtype, s.device)
            self.model = InProcessModel(embedder, quantizes_on_device(embedder, s.dtype))

    def process(self, item: WorkItem) -> CommitRecord:
        with self.progress.tracking(item.index):
            return self._process(item)

    def _process(self, item: WorkItem) -> CommitRecord:
        t0 = time.perf_counter()
        self.load()
        s = self.settings
        docs = read_range(item.source, item.start, item.end, s.read, s.storage_options,
                          self.lines)
        content = tokenize_item(docs, s)
        fs, root = open_fs(s.out, s.storage_options)
        files = ItemFiles(fs, root, s.run_id, s.part, item.index)
        tokens = TokenWriter(files, s.n_output_layers, s.dim, s.dtype)
        model_tokens = 0
        # Units in order; up to ``lookahead`` of them asked of the model before the oldest
        # is written, so a model in another process works while this one writes.
        pending: collections.deque[tuple[list[WindowRow], Any]] = collections.deque()
        for rows in cut_units(content.windows, s.unit_tokens):
            pending.append((rows, self.model.submit([r.tokens for r in rows])))
            while len(pending) > self.model.lookahead:
                model_tokens += self._store_unit(item.index, tokens, *pending.popleft())
        while pending:
            model_tokens += self._store_unit(item.index, tokens, *pending.popleft())
        content.windows = []
        counts = {"tokens": tokens.finish(), "types": len(tokens.type_rows),
                  "sentences": len(content.sentences),
                  "documents": len(content.documents), "errors": len(content.errors)}
        write_small_tables(files, {"sentences": content.sentences,
                                   "documents": content.documents, "errors": content.errors})
        return CommitRecord(
            item=item.index, attempt=files.attempt, files=files.files, sizes=files.sizes,
            sha256=files.sha256, counts=counts, model_tokens=model_tokens,
            input_bytes=item.input_bytes, seconds=time.perf_counter() - t0,
            worker={"host": socket.gethostname(), "pid": os.getpid(), "node": self.node_id},
            peak_rss=peak_rss_bytes(),
        )

    def _store_unit(self, item: int, tokens: TokenWriter, rows: list[WindowRow],
                    handle: Any) -> int:
        """Write one unit's rows once the model's answer is there; its model tokens."""
        s = self.settings
        layers = self.model.collect(handle)
        tokens.add(rows_of_unit(rows, layers, s.n_output_layers, s.dim, s.dtype),
                   getattr(layers, "layer_0", None))  # Int8Layers' layer 0 per type, if so
        del layers  # not held while this item waits for the model with its next unit
        self.progress.add(item, sum(r.own_end - r.own_start for r in rows))
        return sum(len(r.tokens) for r in rows)
