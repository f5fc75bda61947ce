"""Learned task weights: fit a mix's layer weights and gamma with a linear probe.

    elmo mix fit data/ds --labels pos.csv --name pos

The labels file (CSV, TSV, JSON lines or Parquet) has one row per labelled token:
``doc_id, sent_idx, tok_idx, label``. The probe is the paper's task model reduced to a
linear classifier on ``gamma * sum_j softmax(s)_j * h_j`` (``elmo_model.ScalarMix``),
trained with cross-entropy plus ``lambda * ||s||^2``: a large lambda pulls the weights
towards a plain average, as in the paper. Accuracy is measured on held-out sentences
(a hash of doc_id and sent_idx picks them, so the split is stable run to run), for the
fitted mix and for a probe on each single layer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elmo_model.errors import ElmoUserError
from pipeline.lookup.layers.tokens import check_layers, matrix, read_table
from schemas.dataset import open_dataset, save_mix
from schemas.mix_specs import Mix, check_name

KEYS = ["doc_id", "sent_idx", "tok_idx"]


def read_labels(path: str) -> Any:
    """The labels file as an Arrow table with ``doc_id, sent_idx, tok_idx, label``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    p = Path(path)
    if not p.is_file():
        raise ElmoUserError(f"labels file not found: {path}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(p)
        elif suffix in (".jsonl", ".json", ".ndjson"):
            import pyarrow.json as pj

            table = pj.read_json(p)
        else:
            import pyarrow.csv as pcsv

            delimiter = "\t" if suffix in (".tsv", ".tab") else ","
            table = pcsv.read_csv(p, parse_options=pcsv.ParseOptions(delimiter=delimiter),
                                  convert_options=pcsv.ConvertOptions(
                                      column_types={"doc_id": pa.string(), "label": pa.string()}))
    except (pa.ArrowInvalid, OSError) as error:
        raise ElmoUserError(f"{path}: cannot read labels ({str(error).splitlines()[0]})") from None
    missing = [c for c in [*KEYS, "label"] if c not in table.column_names]
    if missing:
        raise ElmoUserError(f"{path}: labels need columns doc_id, sent_idx, tok_idx, label "
                            f"(missing {', '.join(missing)})")
    try:
        return pa.table({
            "doc_id": table["doc_id"].cast(pa.string()),
            "sent_idx": table["sent_idx"].cast(pa.int32()),
            "tok_idx": table["tok_idx"].cast(pa.int32()),
            "label": pc.cast(table["label"], pa.string()),
        })
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise ElmoUserError(f"{path}: bad label columns ({error})") from None


def gather(dataset: str, labels: Any) -> tuple[list[np.ndarray], np.ndarray, list[str],
                                                np.ndarray]:
    """(layers [L+1] x [n, dim] float32, label ids, class names, held-out mask)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = open_dataset(dataset)
    n_layers = ds.descriptor.n_output_layers
    if n_layers < 1:
        raise ElmoUserError(f"{dataset} stores no layers to fit a mix on")
    layer_cols = [f"layer_{k}" for k in range(n_layers)]
    files = ds.paths("tokens")
    if not files:
        raise ElmoUserError(f"{dataset} has no committed shards yet")
    try:
        check_layers(pq.read_schema(files[0], filesystem=ds.arrow_filesystem()), layer_cols,
                     files[0])
    except ElmoUserError:
        raise ElmoUserError(f"{dataset} stores no layer columns to fit a mix on") from None
    # The labelled documents' tokens, every layer as floats, in stored order.
    documents = labels["doc_id"].unique().to_pylist()
    rows = read_table(ds, "tokens", filters=[("doc_id", "in", documents)])
    rows = rows.append_column("_row", pa.array(np.arange(rows.num_rows), pa.int64()))
    hit = rows.select([*KEYS, "_row"]).join(labels, keys=KEYS, join_type="inner")
    hit = hit.sort_by("_row")
    if not hit.num_rows:
        raise ElmoUserError("no labelled token was found in the dataset (check doc_id, "
                            "sent_idx, tok_idx)")
    taken = rows.take(hit["_row"])
    layers = [np.array(matrix(taken[col]), np.float32) for col in layer_cols]
    found = hit.select([*KEYS, "label"])
    names = sorted(set(found["label"].to_pylist()))
    if len(names) < 2:
        raise ElmoUserError("the labels name fewer than 2 classes")
    index = {name: i for i, name in enumerate(names)}
    y = np.array([index[v] for v in found["label"].to_pylist()], np.int64)
    held_out = np.array([
        hashlib.sha256(f"{d}\x00{s}".encode()).digest()[0] < 52  # ~20% of sentences
        for d, s in zip(found["doc_id"].to_pylist(), found["sent_idx"].to_pylist(), strict=True)
    ])
    if held_out.all() or not held_out.any():  # tiny label sets: fall back to every 5th row
        held_out = np.arange(len(y)) % 5 == 0
    return layers, y, names, held_out


@dataclass
class FitResult:
    mix: Mix
    accuracy: float  # held-out accuracy of the mix probe
    layer_accuracy: list[float]  # held-out accuracy of a probe on each single layer
    n_train: int
    n_test: int
    classes: list[str]

    def chart(self, width: int = 30) -> list[str]:
        lines = []
        for k, (w, acc) in enumerate(zip(self.mix.weights, self.layer_accuracy, strict=True)):
            bar = "█" * round(w * width)
            lines.append(f"layer {k}  {bar:<{width}} {w:5.3f}   layer-only probe acc {acc:.3f}")
        lines.append(f"mix      gamma {self.mix.gamma:<{width - 6}.4g}         "
                     f"mix probe acc        {self.accuracy:.3f}")
        return lines


def _train_probe(layers: list[Any], y: Any, n_classes: int, train: Any, fixed: int | None,
                 lam: float, epochs: int, seed: int) -> tuple[Any, float]:
    """(ScalarMix, held-out accuracy); ``fixed=k`` trains a probe on layer k alone."""
    import torch

    from elmo_model import ScalarMix

    torch.manual_seed(seed)
    n_layers, dim = len(layers), layers[0].shape[1]
    if fixed is None:
        mix = ScalarMix(n_layers)
    else:
        # One-hot weights: softmax of a large margin, not trained.
        init = [0.0 if k == fixed else -1e4 for k in range(n_layers)]
        mix = ScalarMix(n_layers, initial_weights=init, trainable=False)
    head = torch.nn.Linear(dim, n_classes)
    params = [*head.parameters(), *(p for p in mix.parameters() if p.requires_grad)]
    optimizer = torch.optim.Adam(params, lr=0.02)
    tr = torch.from_numpy(train)
    x_train = [layer[tr] for layer in layers]
    y_t = y[tr]
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(mix(x_train)), y_t)
        if fixed is None:
            loss = loss + lam * (mix.scalars ** 2).sum()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        te = torch.from_numpy(~train)
        pred = head(mix([layer[te] for layer in layers])).argmax(1)
        acc = float((pred == y[te]).float().mean()) if te.any() else float("nan")
    return mix, acc


def fit_mix(dataset: str, labels_path: str, name: str, lam: float = 0.001, epochs: int = 300,
            seed: int = 0, save: bool = True) -> FitResult:
    import torch

    check_name(name)
    labels = read_labels(labels_path)
    layers_np, y_np, classes, held_out = gather(dataset, labels)
    layers = [torch.from_numpy(a) for a in layers_np]
    y = torch.from_numpy(y_np)
    train = ~held_out
    # A probe's matrices are a few hundred rows: extra torch threads only fight over the
    # cores (several times slower than one thread on a busy machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mix_module, acc = _train_probe(layers, y, len(classes), train, None, lam, epochs, seed)
        per_layer = [_train_probe(layers, y, len(classes), train, k, lam, epochs, seed)[1]
                     for k in range(len(layers))]
    finally:
        torch.set_num_threads(threads)
    weights = torch.softmax(mix_module.scalars.detach(), 0).tolist()
    mix = Mix(name, tuple(weights), float(mix_module.gamma.detach()), False,
              {"fitted_on": str(labels_path), "lambda": lam, "classes": len(classes),
               "held_out_accuracy": round(acc, 4), "n_train": int(train.sum())})
    if save:
        save_mix(dataset, mix)
    return FitResult(mix, acc, per_layer, int(train.sum()), int(held_out.sum()), classes)
