"""A synthetic dataset in the real layout, for tests and benchmarks that need more tokens
than an embedding run gives in seconds.

``write_synthetic`` writes ``_dataset.json``, committed manifest entries and hive-partitioned
Parquet through the pipeline's own ``TokenWriter`` (so the stored layout of ``dtype``: types
files, int8 with scales), with vectors that imitate contextual embeddings: a Zipf-distributed
vocabulary, each word a random centre with 1-4 "sense" offsets plus per-occurrence noise;
layer 0 is the bare word centre, layers 1 and 2 add sense and noise. ``bench/lookup.py``
uses it too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.write.item_files import TokenWriter
from schemas import TABLE_SCHEMAS, DatasetDescriptor


class _ShardFiles:
    """Where the pipeline's TokenWriter puts a shard's files here: at their final names
    (a bench dataset needs no staging or checksums)."""

    def __init__(self, out: Path, shard: int) -> None:
        self.out, self.shard = out, shard

    def open(self, table: str):
        folder = self.out / table / f"shard={self.shard}"
        folder.mkdir(parents=True, exist_ok=True)
        return open(folder / "main.parquet", "wb")

    def closed(self, table: str, handle) -> None:
        handle.close()


def write_synthetic(out: Path, n_tokens: int, dim: int, n_shards: int = 4, vocab: int = 20_000,
                    seed: int = 0, dtype: str = "float16") -> dict[str, np.ndarray]:
    """Write the dataset; returns the float32 top-layer vectors and tokens for ground truth."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1)
    p = 1.0 / ranks
    words = rng.choice(vocab, size=n_tokens, p=p / p.sum())
    centres = rng.standard_normal((vocab, dim), dtype=np.float32)
    n_senses = rng.integers(1, 5, size=vocab)
    sense_offsets = rng.standard_normal((vocab, 4, dim), dtype=np.float32) * 0.6
    senses = (rng.random(n_tokens) * n_senses[words]).astype(np.int64)
    descriptor = DatasetDescriptor(
        model_fingerprint="synthetic-" + hashlib.sha256(f"{seed}".encode()).hexdigest()[:16],
        n_output_layers=3, dim=dim, dtype=dtype, n_shards=n_shards,
        tokenizer={"name": "synthetic", "version": "1"}, model={"synthetic": True})
    out.mkdir(parents=True)
    (out / "_dataset.json").write_text(descriptor.to_json())
    top = np.empty((n_tokens, dim), np.float16)
    per_shard = np.array_split(np.arange(n_tokens), n_shards)
    for shard, idx in enumerate(per_shard):
        n = len(idx)
        sent = idx // 20
        doc_ids = pa.array([f"doc{s // 10}" for s in sent])
        w = words[idx]
        layer0 = centres[w]
        layer1 = layer0 + sense_offsets[w, senses[idx]] + 0.3 * rng.standard_normal(
            (n, dim), dtype=np.float32)
        layer2 = layer0 + sense_offsets[w, senses[idx]] + 0.5 * rng.standard_normal(
            (n, dim), dtype=np.float32)
        top[idx] = layer2.astype(np.float16)
        tokens = pa.array([f"w{x}" for x in w])
        cols = {
            "doc_id": doc_ids, "sent_idx": pa.array(sent % 10, pa.int32()),
            "tok_idx": pa.array(idx % 20, pa.int32()), "token": tokens,
            "char_start": pa.array((idx % 20) * 6, pa.int32()),
            "char_end": pa.array((idx % 20) * 6 + 5, pa.int32()),
        }
        value_dtype = np.float16 if dtype == "float16" else np.float32
        for k, layer in enumerate((layer0, layer1, layer2)):
            cols[f"layer_{k}"] = pa.FixedSizeListArray.from_arrays(
                pa.array(layer.astype(value_dtype).reshape(-1)), dim)
        # The pipeline's own writer: the stored layout of ``dtype`` (types file, int8).
        writer = TokenWriter(_ShardFiles(out, shard), 3, dim, dtype)  # type: ignore[arg-type]
        writer.add(pa.table(cols))
        writer.finish()
        sent_ids = np.unique(sent)
        sentences = pa.table({
            "doc_id": pa.array([f"doc{s // 10}" for s in sent_ids]),
            "sent_idx": pa.array(sent_ids % 10, pa.int32()),
            # Each text its own, so that a test sees whose sentence a hit was given.
            "text": pa.array([f"doc{s // 10}.{s % 10}: " + "w " * 20 for s in sent_ids]),
            "char_start": pa.array(np.zeros(len(sent_ids)), pa.int32()),
            "char_end": pa.array(np.full(len(sent_ids), 120), pa.int32()),
            "n_tokens": pa.array(np.full(len(sent_ids), 20), pa.int32()),
            "n_windows": pa.array(np.ones(len(sent_ids)), pa.int32()),
        })
        empty = {name: TABLE_SCHEMAS[name].empty_table() for name in ("documents", "errors")}
        for table_name, table in (("sentences", sentences), *empty.items()):
            folder = out / table_name / f"shard={shard}"
            folder.mkdir(parents=True)
            pq.write_table(table, folder / "main.parquet", compression="zstd")
        manifest = out / "_manifest" / "main"
        manifest.mkdir(parents=True, exist_ok=True)
        (manifest / f"shard={shard}.json").write_text(json.dumps({
            "shard": shard, "part": "main", "run_id": "bench", "counts": {"tokens": n},
            "files": {t: f"{t}/shard={shard}/main.parquet"
                      for t in ("tokens", "types", "sentences")
                      if (out / t / f"shard={shard}").exists()}}))
    return {"top": top.astype(np.float32), "words": words}
