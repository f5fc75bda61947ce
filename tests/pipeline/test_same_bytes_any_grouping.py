"""Same bytes whatever the batch (issue 50): the same documents embedded by `elmo embed`
with the default model as one JSONL file, as two, in reverse order with other batch and
unit sizes, store byte-identical int8 layers for every token. Before, 517 of 49,284
tokens differed when a JSONL was cut in two. The kernel-level tests are in
tests/model/test_batch_independence.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import REPO, run_cli

KEY = ["doc_id", "sent_idx", "tok_idx"]


def _documents() -> list[dict[str, str]]:
    """Paragraphs of the bundled sample, a few lines each: sentences of many lengths, so
    a batch's longest sentence often runs its last steps alone."""
    lines = [line for line in (REPO / "data/sample/austen.txt").read_text().splitlines()
             if len(line.split()) > 3][:36]
    return [{"id": f"austen-{i}", "text": " ".join(lines[i : i + 3])}
            for i in range(0, len(lines), 3)]


def _write_jsonl(path: Path, documents: list[dict[str, str]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d) + "\n" for d in documents))
    return str(path)


def _stored_layers(out: Path) -> dict[str, np.ndarray]:
    """Every stored int8 layer column and scale of the tokens table, rows by (doc_id,
    sent_idx, tok_idx), as raw bytes (scales as their bit patterns)."""
    table = pq.read_table(out / "tokens", columns=None).sort_by([(k, "ascending") for k in KEY])
    columns = [name for name in table.column_names if name.startswith("layer_")]
    assert columns, "no layer columns stored"
    stored = {name: np.asarray(table.column(name).to_pylist()) for name in columns}
    stored["key"] = np.asarray([f"{d}/{s}/{t}" for d, s, t in zip(
        *(table.column(k).to_pylist() for k in KEY), strict=True)])
    for name in columns:
        if name.endswith("_scale"):
            stored[name] = stored[name].astype(np.float32).view(np.uint32)
    return stored


@pytest.mark.slow
def test_one_file_two_files_and_other_batches_store_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    documents = _documents()
    half = len(documents) // 2
    runs = {
        "one file": [_write_jsonl(tmp_path / "one/all.jsonl", documents)],
        "two files": [_write_jsonl(tmp_path / "two/first.jsonl", documents[:half]),
                      _write_jsonl(tmp_path / "two/second.jsonl", documents[half:])],
        "reversed, small batches": [_write_jsonl(tmp_path / "reversed/all.jsonl",
                                                 documents[::-1]),
                                    "--batch-tokens", "97", "--unit-tokens", "211"],
    }
    stored = {}
    for name, arguments in runs.items():
        out = tmp_path / f"{name.replace(' ', '_').replace(',', '')}.ds"
        code = run_cli(monkeypatch, ["embed", *arguments, "--out", str(out), "--model",
                                     str(REPO / "models/default"), "--no-progress",
                                     "--executor", "local"])
        assert code == 0, name
        stored[name] = _stored_layers(out)
    want = stored.pop("one file")
    assert len(want["key"]) > 1000
    for name, got in stored.items():
        assert np.array_equal(got["key"], want["key"]), f"{name}: other tokens stored"
        for column, values in want.items():
            differ = (got[column] != values).reshape(len(values), -1).any(axis=1)
            assert not differ.any(), (f"{name}: {column} differs for {int(differ.sum())} "
                                      f"tokens, e.g. {want['key'][differ][:3].tolist()}")
