"""Corpus -> every biLM layer of every token, in hive-partitioned Parquet, exactly once.

The driver plans and commits; workers read, tokenize, embed and write:

    pipeline/write/plan.py       list sources -> work items (byte ranges; no text is read)
    pipeline/write/work_item.py  item -> read -> tokenize -> windows -> biLM -> Parquet in staging
                           -> CommitRecord (files, rows, sizes, checksums; no activations)
    pipeline/write/item_files.py the item's Parquet files in staging, hashed as they are written
    pipeline/write/executors.py  run items in-process (local) or on a Ray actor pool, a bounded
                           number in flight, retrying items of dead workers
    pipeline/write/commit.py     check a record, move its files into place, write the manifest

This module is the driver: it checks the request (fail fast, before the output is
touched), takes the dataset lock, records the descriptor and the plan, streams the
uncommitted items through an executor, commits each as it finishes, and leaves the
output as it found it when a run fails before its first commit. Item files depend only
on the item and the settings, so a resumed run, a retried item or a run with another
actor count writes the same bytes.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import elmo_model
from elmo_model.errors import SettingError
from pipeline.tokenize import get_tokenizer, model_tokenizer
from pipeline.write.commit import commit_item, discard_attempt
from pipeline.write.config import EmbedConfig, ModelSpec
from pipeline.write.executors import make_executor
from pipeline.write.inputs import ReadOptions
from pipeline.write.output import (
    PartWrite,
    abandon_part,
    begin_part,
    check_output_dir,
    clear_staging,
    uncommit_items,
)
from pipeline.write.plan import BYTES_PER_TOKEN, item_bytes, plan_items, plan_record
from pipeline.write.work_item import (
    ItemSettings,
    peak_rss_bytes,
)
from schemas import DatasetDescriptor
from schemas.files import open_fs
from schemas.lock import DatasetLock
from schemas.manifest import live_counts, sum_counts
from schemas.verify import verify_dataset


@dataclass
class EmbedSummary:
    out: str
    documents: int = 0  # stored by this run
    sentences: int = 0
    tokens: int = 0
    errors: int = 0
    items_written: int = 0
    items_resumed: int = 0  # committed by an earlier run, kept as they were
    repaired: list[str] = field(default_factory=list)  # --repair: damaged files found
    documents_resumed: int = 0
    tokens_resumed: int = 0
    elapsed_s: float = 0.0
    start_s: float = 0.0  # of elapsed_s, before the first item: Ray, actors, the model's load
    executor: str = "local"
    totals: dict[str, int] = field(default_factory=dict)  # whole dataset, from the manifest
    # Measurements (benchmarks): peak RSS of every worker process and of the driver, and
    # the bytes of what workers returned to the driver (pickled commit records).
    worker_peak_rss: dict[str, int] = field(default_factory=dict)  # "host:pid" -> bytes
    driver_peak_rss: int = 0
    returned_bytes: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def lines(self) -> list[str]:
        lines = [f"repair: {line}" for line in self.repaired]
        if self.items_resumed:
            lines.append(f"resumed: {self.items_resumed} items committed by an earlier run kept "
                         f"({self.documents_resumed} documents, {self.tokens_resumed} tokens)")
        lines.append(
            f"embedded {self.documents} documents, {self.sentences} sentences, {self.tokens} "
            f"tokens in {self.items_written} items in {self.elapsed_s:.1f} s "
            f"({self.tokens_per_s:,.0f} tokens/s, {self.executor}; {self.start_s:.1f} s of it "
            "starting)")
        if self.errors:
            lines.append(f"{self.errors} bad inputs listed in {self.out.rstrip('/')}/errors/")
        t = self.totals
        lines.append(f"dataset {self.out}: {t.get('documents', 0)} documents, "
                     f"{t.get('sentences', 0)} sentences, {t.get('tokens', 0)} tokens, "
                     f"{t.get('errors', 0)} errors")
        return lines


def describe_dataset(cfg: EmbedConfig, tokenizer: Any) -> Any:
    """The descriptor this run's data needs (``_dataset.json``)."""
    config = elmo_model.read_options(cfg.model.options)
    return DatasetDescriptor(
        model_fingerprint=elmo_model.model_fingerprint(cfg.model.options, cfg.model.weights),
        n_output_layers=config.n_layers + 1,
        dim=config.output_dim,
        dtype=cfg.dtype,
        n_shards=0,  # schema 2: shards are work items, numbered per part (plan.json)
        tokenizer={**tokenizer.record(), "max_sentence_tokens": cfg.max_sentence_tokens,
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


def _progress(total_tokens: int, enabled: bool) -> Any:
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total_tokens, unit="tok", unit_scale=True, desc="embed",
                disable=not enabled, mininterval=0.5 if tty else 30.0, dynamic_ncols=True,
                file=sys.stderr)


class TokenProgress:
    """The embed bar in stored tokens: those of committed items plus what the workers
    report of the items they are running (per model unit), so it moves long before the
    first item commits. The total is the committed tokens plus each uncommitted item's
    input bytes at the tokens per byte measured on the committed items
    (``1 / BYTES_PER_TOKEN`` until one commits): a corpus denser or sparser than the
    first guess corrects its total as items commit, instead of jumping at the end."""

    def __init__(self, bar: Any, item_bytes: dict[int, int] | None = None) -> None:
        self.bar = bar
        # item -> input bytes, of the items not committed yet (None: not known)
        self.item_bytes = None if item_bytes is None else dict(item_bytes)
        self.uncommitted_bytes = sum((item_bytes or {}).values())
        self.committed_tokens = 0
        self.committed_bytes = 0
        self.running: dict[int, int] = {}  # item -> tokens done, for uncommitted items
        self.t0 = time.perf_counter()

    def report(self, snapshot: dict[int, int], committed: set[int]) -> None:
        """A worker's running items; an answer that arrives after its item committed is
        stale and ignored."""
        self.running.update((item, n) for item, n in snapshot.items() if item not in committed)
        self._show()

    def commit(self, item: int, tokens: int) -> None:
        self.running.pop(item, None)
        self.committed_tokens += tokens
        if self.item_bytes is not None:
            size = self.item_bytes.pop(item, 0)
            self.committed_bytes += size
            self.uncommitted_bytes -= size
        self._show()

    def finish(self) -> None:
        self.bar.total = self.bar.n  # nothing is left to estimate: end at 100%
        self.bar.refresh()

    @property
    def tokens(self) -> int:
        return self.committed_tokens + sum(self.running.values())

    def expected_total(self) -> int:
        """Tokens at the end, as far as is known now (the bar's total). Without the
        items' bytes, the bar's own total, raised if the tokens pass it."""
        if self.item_bytes is None:
            return max(self.tokens, self.bar.total or 0)
        per_byte = (self.committed_tokens / self.committed_bytes if self.committed_bytes
                    else 1.0 / BYTES_PER_TOKEN)
        # Each uncommitted item at its expected tokens, or at what it has made if more.
        beyond = sum(max(0.0, done - self.item_bytes.get(item, 0) * per_byte)
                     for item, done in self.running.items())
        return self.committed_tokens + round(self.uncommitted_bytes * per_byte + beyond)

    def _show(self) -> None:
        n = self.tokens
        self.bar.total = self.expected_total()
        rate = n / max(1e-9, time.perf_counter() - self.t0)
        self.bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
        self.bar.update(n - self.bar.n)


def config_from_settings(sources: str | Sequence[str], out: str, **settings: Any
                         ) -> EmbedConfig:
    """The ``EmbedConfig`` of ``pipeline.embed``'s arguments: ``settings`` are
    ``EmbedConfig``'s and ``ReadOptions``' fields by name, and the model as ``model``
    (a directory or a ``ModelSpec``) or ``options`` + ``weights`` (files)."""
    model = settings.pop("model", None)
    options, weights = settings.pop("options", None), settings.pop("weights", None)
    if not isinstance(model, ModelSpec):
        model = ModelSpec.resolve(model, options, weights)
    read_names = {f.name for f in dataclasses.fields(ReadOptions)}
    config_names = {f.name for f in dataclasses.fields(EmbedConfig)} - {
        "sources", "out", "model"}
    unknown = sorted(set(settings) - read_names - config_names)
    if unknown:
        raise SettingError(unknown[0], lambda name: (
            f"{name(unknown[0])} is not a setting of embed; the settings are "
            f"{', '.join(sorted(config_names | read_names))}, model, options, weights"))
    given = {name: settings.pop(name) for name in list(settings) if name in read_names}
    read = settings.pop("read", None)
    if read is not None and given:
        raise SettingError("read", lambda name: (
            f"give the read options either as {name('read')} or one by one, not both"))
    read = read or ReadOptions(**given)
    return EmbedConfig(sources=[sources] if isinstance(sources, str) else list(sources),
                       out=str(out), model=model, read=read, **settings)


def embed_corpus(cfg: EmbedConfig) -> EmbedSummary:
    """Run the whole pipeline; resumable and safe to re-run (see the module docstring)."""
    cfg.validate()
    t0 = time.perf_counter()
    tokenizer = get_tokenizer(cfg.tokenizer or model_tokenizer(cfg.model.options))
    descriptor = describe_dataset(cfg, tokenizer)
    sources = cfg.select_sources()
    fs, root = open_fs(cfg.out, cfg.storage_options)
    check_output_dir(fs, root)
    target = item_bytes(sources, cfg.item_tokens, cfg.min_items)
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    settings = ItemSettings(
        model=cfg.model, tokenizer=tokenizer.name, out=cfg.out, part=cfg.part, run_id=run_id,
        dtype=cfg.dtype, n_output_layers=descriptor.n_output_layers, dim=descriptor.dim,
        # the CPU's sizes until an executor finds its model on a GPU (executors.py)
        batch_tokens=cfg.model_call_sizes(on_gpu=False)[0],
        unit_tokens=cfg.model_call_sizes(on_gpu=False)[1],
        compute_dtype=cfg.compute_dtype, device=cfg.device,
        max_sentence_tokens=cfg.max_sentence_tokens, window_overlap=cfg.window_overlap,
        read=cfg.read, storage_options=cfg.storage_options)
    executor = make_executor(cfg, settings)
    summary = EmbedSummary(out=cfg.out, executor=executor.name)
    write = PartWrite(part=cfg.part, root_existed=fs.exists(root))
    try:
        # Fail fast: resources and the model are checked before the output is touched.
        executor.start()
        summary.start_s = time.perf_counter() - t0
        _write(fs, root, cfg, descriptor, sources, target, executor, run_id, summary, write)
    except BaseException:
        abandon_part(fs, root, write)
        raise
    finally:
        executor.close()
    summary.driver_peak_rss = peak_rss_bytes()
    summary.elapsed_s = time.perf_counter() - t0
    return summary


def _uncommit_damaged(fs: Any, root: str, part: str, descriptor: Any, write: PartWrite,
                      summary: EmbedSummary) -> None:
    """``--repair``, under the lock: verify the part's committed items and un-commit the
    damaged ones, so that the resume below re-embeds exactly those."""
    report = verify_dataset(fs, root, descriptor, parts=[part])
    bad = report.bad_items().get(part, set())
    uncommit_items(fs, root, part, {k: write.resumed[k] for k in bad if k in write.resumed})
    write.resumed = {k: v for k, v in write.resumed.items() if k not in bad}
    summary.repaired = [check.line() for check in report.problems]


def _write(fs: Any, root: str, cfg: EmbedConfig, descriptor: Any, sources: list[Any],
           target: int, executor: Any, run_id: str, summary: EmbedSummary,
           write: PartWrite) -> None:
    with DatasetLock(fs, root):
        begin_part(fs, root, write, descriptor, plan_record(sources, cfg.read, target))
        if cfg.repair:
            _uncommit_damaged(fs, root, cfg.part, descriptor, write, summary)
        done = write.resumed
        summary.items_resumed = len(done)
        resumed = sum_counts(done.values())
        summary.documents_resumed += resumed.get("documents", 0)
        summary.tokens_resumed += resumed.get("tokens", 0)
        # Two passes over the plan (a generator; no text read): the bar's total, the work.
        item_bytes = {item.index: item.input_bytes
                      for item in plan_items(sources, cfg.read, target)
                      if item.index not in done}
        pending = (item for item in plan_items(sources, cfg.read, target)
                   if item.index not in done)
        committed: set[int] = set()  # item numbers only: duplicates of them are discarded
        info = {"compute_dtype": cfg.compute_dtype}
        try:
            with _progress(sum(item_bytes.values()) // BYTES_PER_TOKEN, cfg.progress) as bar:
                progress = TokenProgress(bar, item_bytes)
                report = (lambda snapshot: progress.report(snapshot, committed)
                          ) if cfg.progress else None
                for item, record in executor.run(pending, report):
                    summary.returned_bytes += len(pickle.dumps(record))
                    worker = f"{record.worker.get('host')}:{record.worker.get('pid')}"
                    summary.worker_peak_rss[worker] = max(
                        record.peak_rss, summary.worker_peak_rss.get(worker, 0))
                    if item.index in committed:  # a duplicate attempt: never visible
                        discard_attempt(fs, root, record)
                        continue
                    commit_item(fs, root, cfg.part, run_id, item, record, info)
                    committed.add(item.index)
                    write.commits += 1
                    c = record.counts
                    summary.items_written += 1
                    summary.documents += c.get("documents", 0)
                    summary.sentences += c.get("sentences", 0)
                    summary.tokens += c.get("tokens", 0)
                    summary.errors += c.get("errors", 0)
                    progress.commit(item.index, c.get("tokens", 0))
                progress.finish()
        finally:
            clear_staging(fs, root, run_id)
        summary.totals = live_counts(fs, root)
