"""Corpus -> every biLM layer of every token, in hive-partitioned Parquet, exactly once.

    sources (fsspec glob) --read--> documents --tokenize--> sentences --window--> windows
        --group by shard = hash(doc_id) mod n--> units (a few batches' worth of windows)
        --embed (in-process, or Ray actor pool holding the model)--> token rows
        --driver writes each shard to staging, commits it (see pipeline/store.py)

Work is cut into *units* deterministically (by shard, in document order, by a token
count), and a unit's numbers depend only on its own content: the embedder batches
inside a unit by a token budget over length-sorted sentences, and its token cache
returns vectors bitwise equal to fresh ones (the char CNN runs in fixed-shape chunks),
so it is kept across units. A resumed run, or a run with another actor count, computes
every stored shard from the same units in the same way and writes the same bytes.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError
from pipeline.sources import (
    DocError,
    Document,
    ReadOptions,
    SourceFile,
    list_sources,
    read_documents,
)
from pipeline.tokenize import (
    TOKENIZER_NAME,
    TOKENIZER_VERSION,
    Sentence,
    Token,
    split_sentences,
    windows,
)

DEFAULT_SHARDS = 8
DEFAULT_BATCH_TOKENS = 4096
DEFAULT_MAX_SENTENCE_TOKENS = 256
DEFAULT_WINDOW_OVERLAP = 32
ROW_GROUP_BYTES = 64 << 20  # ~64 MB row groups: large scans for DuckDB/LanceDB, bounded RAM
EXECUTORS = ("auto", "local", "ray")
DEVICES = ("auto", "cpu", "cuda")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


def shard_of(doc_id: str, n_shards: int) -> int:
    """Stable across runs, machines and Python versions (unlike ``hash()``)."""
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n_shards


@dataclass(frozen=True)
class ModelSpec:
    options: str
    weights: str

    @classmethod
    def resolve(cls, model_dir: str | None = None, options: str | None = None,
                weights: str | None = None) -> ModelSpec:
        """``--model DIR``, or ``--options F --weights F``, or the bundled default model."""
        import elmo_model

        if options or weights:
            if not (options and weights):
                raise ElmoUserError("--options and --weights go together; give both or --model")
            for path in (options, weights):
                if not Path(path).is_file():
                    raise ElmoUserError(f"model file not found: {path}")
            return cls(str(Path(options).resolve()), str(Path(weights).resolve()))
        directory = Path(model_dir) if model_dir else elmo_model.default_model_dir()
        if not (directory / elmo_model.OPTIONS_FILE).is_file():
            if model_dir is None:
                raise ElmoUserError(f"no bundled model in {directory} yet; pass --model DIR "
                                    "or --options FILE --weights FILE")
            raise ElmoUserError(f"{directory}: no {elmo_model.OPTIONS_FILE} in the model directory")
        weights_path = elmo_model.find_weights(directory)
        options_path = (directory / elmo_model.OPTIONS_FILE).resolve()
        return cls(str(options_path), str(weights_path.resolve()))


@dataclass(frozen=True)
class EmbedConfig:
    sources: list[str]
    out: str
    model: ModelSpec
    n_shards: int = DEFAULT_SHARDS
    actors: int = 1
    dtype: str = "float16"  # storage dtype of the layer columns
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    executor: str = "auto"  # auto: Ray when actors > 1, a GPU, or a Ray address; else local
    max_sentence_tokens: int = DEFAULT_MAX_SENTENCE_TOKENS
    window_overlap: int = DEFAULT_WINDOW_OVERLAP
    read: ReadOptions = field(default_factory=ReadOptions)
    part: str = "main"
    progress: bool = True
    storage_options: dict | None = None
    cpus_per_actor: float | None = None
    gpus_per_actor: float | None = None
    ray_address: str | None = None
    unit_tokens: int | None = None  # tokens per unit of work; default 4 x batch_tokens
    compute_dtype: str = "float32"  # model arithmetic: float32, bfloat16, float16 (CUDA only)
    device: str = "auto"  # auto: CUDA when the process (actor) has a GPU, else CPU
    # Embed only these files of ``sources`` (None: all of them). A URI string is looked up
    # in the listing of ``sources``; a SourceFile (from ``list_sources(sources)``) is used
    # as given, without listing again. Either way a file keeps the path relative to its
    # glob's fixed prefix, hence the same document ids as a run over the whole glob.
    source_files: tuple[SourceFile | str, ...] | None = None
    # Test hook: the first Ray actor call that finds no file at this path creates it and
    # kills its own process, to check that Ray restarts the actor and retries the unit.
    crash_marker: str | None = None

    def validate(self) -> None:
        if self.n_shards < 1:
            raise ElmoUserError("--shards must be at least 1")
        if self.actors < 1:
            raise ElmoUserError("--actors must be at least 1")
        if self.dtype not in ("float16", "float32"):
            raise ElmoUserError(f"--dtype must be float16 or float32, not {self.dtype!r}")
        if self.batch_tokens < 1:
            raise ElmoUserError("--batch-tokens must be at least 1")
        if self.executor not in EXECUTORS:
            raise ElmoUserError(f"--executor must be one of {', '.join(EXECUTORS)}")
        if self.max_sentence_tokens < 2 or not 0 <= self.window_overlap < self.max_sentence_tokens:
            raise ElmoUserError("need --max-sentence-tokens >= 2 and 0 <= --window-overlap < it")
        if not self.part or "/" in self.part or self.part.startswith(("_", ".")):
            raise ElmoUserError(f"bad part name {self.part!r}")
        if self.device not in DEVICES:
            raise ElmoUserError(f"--device must be one of {', '.join(DEVICES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ElmoUserError(f"--compute-dtype must be one of {', '.join(COMPUTE_DTYPES)}")
        if self.compute_dtype == "float16" and self.device == "cpu":
            raise ElmoUserError("--compute-dtype float16 needs CUDA; on the CPU use bfloat16")
        if self.source_files is not None and not self.source_files:
            raise ElmoUserError("source_files is empty: nothing to embed")

    def select_sources(self) -> list[SourceFile]:
        """The files this run embeds, each with its path relative to its glob's prefix."""
        if self.source_files is None:
            return list_sources(self.sources, self.storage_options)
        given = [s for s in self.source_files if isinstance(s, SourceFile)]
        wanted = [s for s in self.source_files if not isinstance(s, SourceFile)]
        if wanted:
            listed = {s.uri: s for s in list_sources(self.sources, self.storage_options)}
            by_path = {s.path: s for s in listed.values()}
            missing = [u for u in wanted if u not in listed and u not in by_path]
            if missing:
                raise ElmoUserError(f"source_files not matched by {' '.join(self.sources)}: "
                                    f"{', '.join(missing[:5])}")
            given += [listed.get(u) or by_path[u] for u in wanted]
        # Sorted and de-duplicated like list_sources: the plan and the ids do not depend
        # on the order the caller listed the files in.
        return sorted({s.uri: s for s in given}.values(), key=lambda s: s.uri)


@dataclass
class EmbedSummary:
    out: str
    documents: int = 0  # stored by this run
    sentences: int = 0
    tokens: int = 0
    errors: int = 0
    shards_written: int = 0
    shards_already_committed: int = 0
    documents_skipped: int = 0  # in shards committed by an earlier run
    elapsed_s: float = 0.0
    executor: str = "local"
    totals: dict[str, int] = field(default_factory=dict)  # whole dataset, from the manifest

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def lines(self) -> list[str]:
        lines = [
            f"embedded {self.documents} documents, {self.sentences} sentences, {self.tokens} "
            f"tokens into {self.shards_written} shards in {self.elapsed_s:.1f} s "
            f"({self.tokens_per_s:,.0f} tokens/s, {self.executor})",
        ]
        if self.shards_already_committed:
            lines.append(f"skipped {self.shards_already_committed} shards committed earlier "
                         f"({self.documents_skipped} documents)")
        if self.errors:
            lines.append(f"{self.errors} bad inputs listed in {self.out.rstrip('/')}/errors/")
        t = self.totals
        lines.append(f"dataset {self.out}: {t.get('documents', 0)} documents, "
                     f"{t.get('sentences', 0)} sentences, {t.get('tokens', 0)} tokens, "
                     f"{t.get('errors', 0)} errors")
        return lines


# --------------------------------------------------------------------------- planning


@dataclass
class ShardWork:
    """Everything one shard will hold, except the vectors (computed per unit)."""

    shard: int
    documents: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    sentences: list[dict] = field(default_factory=list)
    windows: list[tuple] = field(default_factory=list)  # see _window_rows
    units: list[int] = field(default_factory=list)
    tokens: int = 0


def _pretokenized_sentences(doc: Document) -> list[Sentence]:
    out, offset = [], 0
    for words in doc.pretokenized or []:
        tokens = []
        for word in words:
            tokens.append(Token(word, offset, offset + len(word)))
            offset += len(word) + 1  # joined by one space; sentences by one newline
        out.append(Sentence(tuple(tokens)))
    return out


def plan(items: Iterator[Document | DocError], cfg: EmbedConfig, pending: set[int]
         ) -> tuple[dict[int, ShardWork], int]:
    """Tokenize the documents of pending shards; returns (work by shard, skipped docs)."""
    work = {k: ShardWork(k) for k in sorted(pending)}
    skipped = 0
    for item in items:
        shard = shard_of(item.doc_id, cfg.n_shards)
        if shard not in work:
            skipped += 1
            continue
        target = work[shard]
        if isinstance(item, DocError):
            target.errors.append({"doc_id": item.doc_id, "source": item.source,
                                  "line": item.line, "reason": item.reason})
            continue
        sentences = (_pretokenized_sentences(item) if item.pretokenized is not None
                     else split_sentences(item.text))
        if not sentences:
            target.errors.append({"doc_id": item.doc_id, "source": item.source,
                                  "line": item.line, "reason": "no tokens in document"})
            continue
        n_tokens = 0
        for sent_idx, sentence in enumerate(sentences):
            toks = sentence.tokens
            spans = windows(len(toks), cfg.max_sentence_tokens, cfg.window_overlap)
            target.sentences.append({
                "doc_id": item.doc_id, "sent_idx": sent_idx,
                "text": item.text[sentence.start:sentence.end],
                "char_start": sentence.start, "char_end": sentence.end,
                "n_tokens": len(toks), "n_windows": len(spans),
            })
            for w in spans:
                piece = toks[w.start:w.end]
                target.windows.append((item.doc_id, sent_idx, w.start, w.own_start, w.own_end,
                                       [t.text for t in piece], [t.start for t in piece],
                                       [t.end for t in piece]))
            n_tokens += len(toks)
        target.tokens += n_tokens
        target.documents.append({
            "doc_id": item.doc_id, "source": item.source, "line": item.line,
            "n_sentences": len(sentences), "n_tokens": n_tokens,
            "metadata": _json_or_none(item.metadata),
        })
    return work, skipped


def _json_or_none(value: Any) -> str | None:
    import json

    return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _unit_table(rows: list[tuple]) -> Any:
    import pyarrow as pa

    cols = list(zip(*rows, strict=True))
    return pa.table({
        "doc_id": pa.array(cols[0], pa.string()),
        "sent_idx": pa.array(cols[1], pa.int32()),
        "start": pa.array(cols[2], pa.int32()),
        "own_start": pa.array(cols[3], pa.int32()),
        "own_end": pa.array(cols[4], pa.int32()),
        "tokens": pa.array(cols[5], pa.list_(pa.string())),
        "char_start": pa.array(cols[6], pa.list_(pa.int32())),
        "char_end": pa.array(cols[7], pa.list_(pa.int32())),
    })


@dataclass
class Unit:
    unit_id: int
    shard: int
    table: Any  # pyarrow.Table of windows (see _unit_table)
    n_rows: int  # token rows it produces (owned tokens)
    n_tokens: int  # tokens it runs through the model (overlaps included)


def make_units(work: dict[int, ShardWork], unit_tokens: int) -> list[Unit]:
    """Cut each shard's windows, in order, into units of about ``unit_tokens`` tokens."""
    units: list[Unit] = []
    for shard in sorted(work):
        rows: list[tuple] = []
        size = 0

        def flush(shard: int = shard) -> None:
            nonlocal rows, size
            if rows:
                owned = sum(r[4] - r[3] for r in rows)
                units.append(Unit(len(units), shard, _unit_table(rows), owned, size))
                work[shard].units.append(len(units) - 1)
            rows, size = [], 0

        for row in work[shard].windows:
            if rows and size + len(row[5]) > unit_tokens:
                flush()
            rows.append(row)
            size += len(row[5])
        flush()
        work[shard].windows = []  # the units hold them now
    return units


# --------------------------------------------------------------------------- embedding


def embed_unit(embedder: Any, unit: Any, dtype: str) -> Any:
    """Token rows (schema ``token_schema`` minus nothing) for one unit's windows."""
    import numpy as np
    import pyarrow as pa

    tokens = unit.column("tokens").to_pylist()
    layers = embedder.embed(tokens)
    starts = unit.column("start").to_numpy()
    own_start = unit.column("own_start").to_numpy()
    own_end = unit.column("own_end").to_numpy()
    lo, hi = own_start - starts, own_end - starts
    n_out = layers[0].shape[0] if layers else embedder.config.n_layers + 1
    dim = embedder.config.output_dim
    np_dtype = np.float16 if dtype == "float16" else np.float32
    stacked = np.concatenate([arr[:, a:b] for arr, a, b in zip(layers, lo, hi, strict=True)],
                             axis=1) if layers else np.zeros((n_out, 0, dim), np.float32)
    counts = hi - lo
    doc_ids = np.repeat(np.array(unit.column("doc_id").to_pylist(), dtype=object), counts)
    sent_idx = np.repeat(unit.column("sent_idx").to_numpy(), counts)
    tok_idx = np.concatenate([np.arange(a, b) for a, b in zip(own_start, own_end, strict=True)]
                             ) if len(counts) else np.zeros(0, np.int64)
    pick = lambda col: [v for vals, a, b in zip(unit.column(col).to_pylist(), lo, hi,  # noqa: E731
                                                strict=True) for v in vals[a:b]]
    value_type = pa.float16() if dtype == "float16" else pa.float32()
    columns: dict[str, Any] = {
        "doc_id": pa.array(doc_ids, pa.string()),
        "sent_idx": pa.array(sent_idx, pa.int32()),
        "tok_idx": pa.array(tok_idx, pa.int32()),
        "token": pa.array(pick("tokens"), pa.string()),
        "char_start": pa.array(pick("char_start"), pa.int32()),
        "char_end": pa.array(pick("char_end"), pa.int32()),
    }
    for k in range(n_out):
        values = pa.array(np.ascontiguousarray(stacked[k]).astype(np_dtype).reshape(-1),
                          value_type)
        columns[f"layer_{k}"] = pa.FixedSizeListArray.from_arrays(values, dim)
    return pa.table(columns)


# Set only inside ``reuse_models()``: in-process runs then share loaded models.
_MODEL_CACHE: contextvars.ContextVar[dict[tuple, Any] | None] = contextvars.ContextVar(
    "elmo_store_model_cache", default=None)


@contextlib.contextmanager
def reuse_models() -> Iterator[None]:
    """Within this block, in-process (``local``) runs load each model once and reuse it.

    For callers that run many small embeddings in a row (jobs: one per changed file).
    Reuse is safe because a unit's vectors do not depend on what the embedder computed
    before (its token cache returns vectors bitwise equal to fresh ones; see the module
    docstring). Ray actors are per run and load their own copy.
    """
    token = _MODEL_CACHE.set({})
    try:
        yield
    finally:
        _MODEL_CACHE.reset(token)


def _load_embedder(spec: ModelSpec, batch_tokens: int, compute_dtype: str, device: str) -> Any:
    """The biLM on ``device`` (auto/cpu/cuda) computing in ``compute_dtype``; elmo_model
    refuses float16 off CUDA and cuda without a GPU, with a user-facing message."""
    import elmo_model

    cache = _MODEL_CACHE.get()
    key = (spec, batch_tokens, compute_dtype, device)
    if cache is not None and key in cache:
        return cache[key]
    embedder = elmo_model.load(spec.options, spec.weights, mode="stateless", device=device,
                               dtype=compute_dtype, max_batch_tokens=batch_tokens)
    if cache is not None:
        cache[key] = embedder
    return embedder


class EmbedActor:
    """Ray Data callable class: loads the biLM once per actor, embeds one unit per call."""

    def __init__(self, spec: ModelSpec, batch_tokens: int, dtype: str, compute_dtype: str,
                 threads: int, crash_marker: str | None = None, device: str = "auto") -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.embedder = _load_embedder(spec, batch_tokens, compute_dtype, device)
        self.dtype = dtype
        self.crash_marker = crash_marker

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        if self.crash_marker and not os.path.exists(self.crash_marker):
            Path(self.crash_marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), 9)  # die like an OOM-killed or preempted worker
        out = []
        for unit_id, payload in zip(batch.column("unit").to_pylist(),
                                    batch.column("payload").to_pylist(), strict=True):
            table = pa.ipc.open_stream(payload).read_all()
            rows = embed_unit(self.embedder, table, self.dtype)
            out.append(rows.append_column("unit", pa.array([unit_id] * rows.num_rows, pa.int64())))
        return pa.concat_tables(out)


def _ipc_bytes(table: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _run_local(units: list[Unit], cfg: EmbedConfig) -> Iterator[tuple[int, Any]]:
    embedder = _load_embedder(cfg.model, cfg.batch_tokens, cfg.compute_dtype, cfg.device)
    for unit in units:
        yield unit.unit_id, embed_unit(embedder, unit.table, cfg.dtype)


def _quiet_ray_env() -> None:
    # Ray 2.60 turns token auth on for local clusters and logs a C++ line per actor pool.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")


def _run_ray(units: list[Unit], cfg: EmbedConfig) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    _quiet_ray_env()
    import ray

    # Our bar replaces Ray Data's; these two loggers only announce that, and that it ended.
    for name in ("ray.data._internal.progress", "ray.data._internal.execution.streaming_executor"):
        logging.getLogger(name).setLevel(logging.ERROR)
    started_here = False
    if not ray.is_initialized():
        ray.init(address=cfg.ray_address, logging_level=logging.WARNING, log_to_driver=False,
                 include_dashboard=False)
        started_here = True
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # our own bar instead
        ctx.print_on_execution_start = False
        ctx.enable_auto_log_stats = False
        ctx.execution_options.preserve_order = True  # results stream back in unit order
        resources = ray.cluster_resources()
        gpus = cfg.gpus_per_actor
        if cfg.device == "cpu":
            gpus = 0.0  # a GPU reserved by an actor that computes on the CPU is wasted
        elif gpus is None:
            # --device cuda asks for one even when the cluster has none yet: an
            # autoscaling cluster adds a GPU node for the pending actor.
            gpus = 1.0 if cfg.device == "cuda" or resources.get("GPU", 0) >= 1 else 0.0
        cpus = cfg.cpus_per_actor or max(1.0, float(int(resources.get("CPU", 1) // cfg.actors)))
        remote = {"num_gpus": gpus} if gpus else {"num_cpus": cpus}
        blocks = [pa.table({"unit": pa.array([u.unit_id], pa.int64()),
                            "payload": pa.array([_ipc_bytes(u.table)], pa.large_binary())})
                  for u in units]
        ds = ray.data.from_arrow(blocks).map_batches(
            EmbedActor,
            fn_constructor_kwargs={
                "spec": cfg.model, "batch_tokens": cfg.batch_tokens, "dtype": cfg.dtype,
                "compute_dtype": cfg.compute_dtype, "threads": int(cpus),
                "crash_marker": cfg.crash_marker, "device": cfg.device,
            },
            compute=ray.data.ActorPoolStrategy(size=cfg.actors),
            batch_size=1,
            batch_format="pyarrow",
            **remote,
        )
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            ids = batch.column("unit")
            # A block may (in principle) hold rows of several units: split by unit id.
            for unit_id in pc.unique(ids).to_pylist():
                part = batch.filter(pc.equal(ids, unit_id)).drop_columns(["unit"])
                yield unit_id, part
    finally:
        if started_here:
            ray.shutdown()


# --------------------------------------------------------------------------- writing


def token_file_compression(schema: Any) -> dict[str, str]:
    """Per-column Parquet codecs for a tokens file (keys are leaf paths, as pyarrow wants).

    zstd everywhere except the contextual layers (``layer_1`` .. ``layer_L``), which get
    snappy: zstd shrinks those activations by only ~9% (464 vs 512 bytes per token for a
    256-d float16 layer of the default model) yet decodes ~5x slower (1.0 vs 5.5 GB/s
    per core here), and decoding them is what mixing on read waits for. Layer 0 is
    context-free, repeated for every occurrence of a word: zstd shrinks it ~5x.
    """
    codecs = {}
    for name in schema.names:
        leaf = f"{name}.list.element" if name.startswith("layer_") else name
        codecs[leaf] = "snappy" if name.startswith("layer_") and name != "layer_0" else "zstd"
    return codecs


class _ShardWriter:
    def __init__(self, fs: Any, root: str, part: str, run_id: str, work: ShardWork,
                 descriptor: Any, info: dict | None = None) -> None:
        import pyarrow.parquet as pq

        from pipeline.store import ShardCommit

        self.work = work
        self.info = info
        self.commit_ = ShardCommit(fs, root, part, run_id, work.shard)
        self.schema = descriptor.token_schema()
        layer_bytes = descriptor.n_output_layers * descriptor.dim * (
            2 if descriptor.dtype == "float16" else 4)
        self.rows_per_group = max(1024, ROW_GROUP_BYTES // max(1, layer_bytes))
        self.handle = self.commit_.open("tokens")
        self.writer = pq.ParquetWriter(
            self.handle, self.schema, compression=token_file_compression(self.schema),
            # Dictionary-encoding float16 lists is 2-4x slower to write and 6-10x to read.
            use_dictionary=["doc_id", "token"],
            write_statistics=["doc_id", "sent_idx", "tok_idx", "char_start", "char_end"],
        )
        self.buffer: list[Any] = []
        self.buffered = 0
        self.rows = 0

    def add(self, table: Any) -> None:
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= self.rows_per_group:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self.buffer:
            table = pa.concat_tables(self.buffer).cast(self.schema)
            self.writer.write_table(table, row_group_size=self.rows_per_group)
            self.rows += table.num_rows
        self.buffer, self.buffered = [], 0

    def finish(self) -> dict:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from schemas import TABLE_SCHEMAS

        self._flush()
        self.writer.close()
        self.handle.close()
        small = {"sentences": self.work.sentences, "documents": self.work.documents,
                 "errors": self.work.errors}
        for name, rows in small.items():
            if not rows:  # no file for a table without rows (ShardCommit.commit)
                continue
            schema = TABLE_SCHEMAS[name]
            table = pa.Table.from_pylist(rows, schema=schema)
            with self.commit_.open(name) as handle:
                pq.write_table(table, handle, compression="zstd")
        counts = {"tokens": self.rows, "sentences": len(self.work.sentences),
                  "documents": len(self.work.documents), "errors": len(self.work.errors)}
        return self.commit_.commit(counts, self.info)


# --------------------------------------------------------------------------- driver


def _choose_executor(cfg: EmbedConfig) -> str:
    if cfg.executor != "auto":
        return cfg.executor
    if cfg.actors > 1 or cfg.ray_address or cfg.gpus_per_actor:
        return "ray"
    if cfg.device == "cpu":
        return "local"  # Ray is only worth starting here to put the model on a GPU
    try:
        import ray

        if ray.is_initialized():
            return "ray"
    except ImportError:
        pass
    import torch

    return "ray" if torch.cuda.is_available() else "local"


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, unit="tok", unit_scale=True, desc="embed", disable=not enabled,
                mininterval=0.5 if tty else 30.0, dynamic_ncols=True, file=sys.stderr)


def dataset_totals(fs: Any, root: str) -> dict[str, int]:
    """Row counts of the live view (what readers see), from the manifest."""
    from pipeline.store import committed_shards, live_parts

    totals: dict[str, int] = {}
    for part in live_parts(fs, root):
        for entry in committed_shards(fs, root, part).values():
            for key, value in entry.get("counts", {}).items():
                totals[key] = totals.get(key, 0) + int(value)
    return totals


def embed_corpus(cfg: EmbedConfig) -> EmbedSummary:
    """Run the whole pipeline; resumable and safe to re-run (see the module docstring)."""
    import elmo_model
    from pipeline.store import (
        DatasetLock,
        check_plan,
        clear_staging,
        committed_shards,
        ensure_descriptor,
        open_output,
    )
    from schemas import DatasetDescriptor

    cfg.validate()
    t0 = time.perf_counter()
    config = elmo_model.read_options(cfg.model.options)
    descriptor = DatasetDescriptor(
        model_fingerprint=elmo_model.model_fingerprint(cfg.model.options, cfg.model.weights),
        n_output_layers=config.n_layers + 1,
        dim=config.output_dim,
        dtype=cfg.dtype,
        n_shards=cfg.n_shards,
        tokenizer={"name": TOKENIZER_NAME, "version": TOKENIZER_VERSION,
                   "max_sentence_tokens": cfg.max_sentence_tokens,
                   "window_overlap": cfg.window_overlap},
        model={"n_layers": config.n_layers, "projection_dim": config.projection_dim,
               "lstm_dim": config.lstm_dim, "max_chars": config.max_chars,
               "state_mode": "stateless",
               "initial_state": elmo_model.resolve_initial_state(cfg.model.weights)[0],
               "options": cfg.model.options, "weights": cfg.model.weights},
        # Informative only: incompatibilities() ignores ``extra``, so a rerun with this or
        # another compute dtype is not refused (each manifest entry records its own).
        extra={"compute_dtype": cfg.compute_dtype},
    )
    sources = cfg.select_sources()
    fs, root = open_output(cfg.out, cfg.storage_options)
    summary = EmbedSummary(out=cfg.out, executor=_choose_executor(cfg))
    with DatasetLock(fs, root):
        ensure_descriptor(fs, root, descriptor)
        check_plan(fs, root, cfg.part, {
            "sources": [[s.uri, s.size, s.version] for s in sources],
            "read": asdict(cfg.read),
        })
        clear_staging(fs, root)
        done = committed_shards(fs, root, cfg.part)
        pending = set(range(cfg.n_shards)) - set(done)
        summary.shards_already_committed = len(done)
        if pending:
            items = read_documents(sources, cfg.read, cfg.storage_options)
            work, summary.documents_skipped = plan(items, cfg, pending)
            units = make_units(work, cfg.unit_tokens or 4 * cfg.batch_tokens)
            _execute(fs, root, cfg, descriptor, work, units, summary)
        summary.totals = dataset_totals(fs, root)
        clear_staging(fs, root)
    summary.elapsed_s = time.perf_counter() - t0
    return summary


def _execute(fs: Any, root: str, cfg: EmbedConfig, descriptor: Any, work: dict[int, ShardWork],
             units: list[Unit], summary: EmbedSummary) -> None:
    """Write results in unit order (the order that makes files identical run to run) and
    commit each shard as soon as its last unit is written."""
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    order = sorted(work)
    pieces: dict[int, list[Any]] = {}
    got: dict[int, int] = {}
    next_unit = 0  # unit ids are 0..n-1 in shard order: write strictly in that order
    next_shard = 0  # index into ``order`` of the next shard to commit
    writers: dict[int, _ShardWriter] = {}

    def writer(shard: int) -> _ShardWriter:
        if shard not in writers:
            writers[shard] = _ShardWriter(fs, root, cfg.part, run_id, work[shard], descriptor,
                                          {"compute_dtype": cfg.compute_dtype})
        return writers[shard]

    def commit_ready() -> None:
        nonlocal next_shard
        while next_shard < len(order):
            shard = order[next_shard]
            if work[shard].units and work[shard].units[-1] >= next_unit:
                return
            writer(shard).finish()
            writers.pop(shard)
            w = work[shard]
            summary.shards_written += 1
            summary.documents += len(w.documents)
            summary.sentences += len(w.sentences)
            summary.tokens += w.tokens
            summary.errors += len(w.errors)
            next_shard += 1

    commit_ready()  # leading shards without units (e.g. only errors) commit at once
    if units:
        run = _run_ray if summary.executor == "ray" else _run_local
        with _progress(sum(u.n_tokens for u in units), cfg.progress) as bar:
            for unit_id, table in run(units, cfg):
                pieces.setdefault(unit_id, []).append(table)
                got[unit_id] = got.get(unit_id, 0) + table.num_rows
                while next_unit < len(units) and got.get(next_unit, -1) == units[next_unit].n_rows:
                    unit = units[next_unit]
                    for piece in pieces.pop(next_unit):
                        writer(unit.shard).add(piece)
                    bar.update(unit.n_tokens)
                    next_unit += 1
                    commit_ready()
    commit_ready()
    if next_shard < len(order):
        raise RuntimeError(f"internal error: {len(order) - next_shard} shards left incomplete")
