"""Storage format benchmark: bytes per token by column, and int8's fidelity.

    .venv/bin/python bench/storage_format.py --datasets F32 F16 I8 [--queries 300]

``F32``, ``F16``, ``I8``: the same corpus embedded with ``--dtype float32``, ``float16``
and ``int8`` (the model decides what the fidelity figures mean: use trained weights for
them; random weights are fine for bytes). Reported per dataset: bytes per token of
``tokens/`` plus ``types/`` and per column (Parquet compressed sizes); for int8 against
float32, the cosine of each token's every layer (mean, min); for sense search, top-10
neighbour overlap of int8 against float16 for ``--queries`` random tokens, exact cosine
over every token, with the mixes ``top`` and ``average``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.lookup.layers.mixes import mix_arrays
from pipeline.lookup.layers.tokens import read_tokens
from schemas.dataset import open_dataset


def bytes_per_token(path: str) -> dict[str, float]:
    ds = open_dataset(path)
    columns: dict[str, int] = defaultdict(int)
    rows = 0
    for table in ("tokens", "types"):
        for file in ds.paths(table):
            meta = pq.read_metadata(file)
            rows += meta.num_rows if table == "tokens" else 0
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                for c in range(group.num_columns):
                    name = group.column(c).path_in_schema.split(".")[0]
                    key = f"types.{name}" if table == "types" else name
                    columns[key] += group.column(c).total_compressed_size
            columns[f"{table} (whole files)"] += Path(file).stat().st_size
    out = {k: v / rows for k, v in sorted(columns.items())}
    out["total tokens/ + types/"] = out["tokens (whole files)"] + out.get("types (whole files)", 0)
    out["tokens"] = rows
    return out


def layers(path: str) -> tuple[list[np.ndarray], list[str]]:
    table = read_tokens(path).sort_by([("doc_id", "ascending"), ("sent_idx", "ascending"),
                                      ("tok_idx", "ascending")])
    names = [c for c in table.column_names if c.startswith("layer_")]
    return ([np.stack(table[n].to_numpy(zero_copy_only=False)).astype(np.float32)
             for n in names], table["token"].to_pylist())


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def top10(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    unit = vectors / (np.linalg.norm(vectors, axis=1, keepdims=True) + 1e-30)
    scores = unit[queries] @ unit.T
    scores[np.arange(len(queries)), queries] = -np.inf  # not the query itself
    return np.argsort(-scores, axis=1)[:, :10]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs=3, required=True, metavar=("F32", "F16", "I8"))
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    f32, f16, i8 = args.datasets
    report: dict[str, object] = {p: bytes_per_token(p) for p in args.datasets}
    ref, tokens = layers(f32)
    half, _ = layers(f16)
    quant, tokens_i8 = layers(i8)
    assert tokens == tokens_i8
    for name, got in (("float16", half), ("int8", quant)):
        cos = [cosine_rows(r, g) for r, g in zip(ref, got, strict=True)]
        report[f"cosine {name} vs float32 per layer (mean, min)"] = [
            (float(c.mean()), float(c.min())) for c in cos]
    rng = np.random.default_rng(0)
    queries = rng.choice(len(tokens), size=min(args.queries, len(tokens)), replace=False)
    ds = open_dataset(f16)
    for mix_name in ("top", "average"):
        mix = ds.mix(mix_name)
        a = top10(mix_arrays(half, mix), queries)
        b = top10(mix_arrays(quant, mix), queries)
        overlap = np.mean([len(set(x) & set(y)) / 10 for x, y in zip(a, b, strict=True)])
        report[f"top-10 overlap int8 vs float16 ({mix_name})"] = float(overlap)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
