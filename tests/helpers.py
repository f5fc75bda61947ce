"""Helpers shared by the tests (no tests here): the repository's paths, a small mixed
corpus and embed config for the pipeline tests, a tiny biLM config and a toy corpus for the
training tests, and a dataset comparison."""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from elmo_model.model import BiLMConfig, BiLstmLayer, LstmStep, PackPlan
from pipeline.write.embed import EmbedConfig, ModelSpec

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
TEXT_A = [
    "The cat sat on the mat. It was happy!",
    "",
    "Mr. Smith didn't go to Washington; he stayed home.",
    "A third line with numbers 3.14 and 1,000 in it.",
]
TEXT_B = ["One more file. Two sentences here.", "Short"]


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text("\n".join(TEXT_A) + "\n")
    (folder / "b.txt").write_text("\n".join(TEXT_B))
    records = [{"id": "j1", "text": "JSON lines work too. Yes.", "lang": "en"},
               {"id": "j2", "text": "Another record."}]
    (folder / "c.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    pq.write_table(pa.table({"id": ["p1", "p2"], "text": ["Parquet text.", "And more of it."]}),
                   folder / "d.parquet")
    return folder


def config(model_dir: Path, sources: list[str], out: Path | str, **kw: object) -> EmbedConfig:
    kw.setdefault("progress", False)
    kw.setdefault("executor", "local")
    return EmbedConfig(sources=sources, out=str(out), model=ModelSpec.resolve(str(model_dir)),
                       **kw)  # type: ignore[arg-type]


def read_table(out: Path | str, table: str) -> pa.Table:
    """One table of a dataset; tokens with every layer, as readers see them (v3 keeps
    layer 0 in the types table)."""
    if table == "tokens":
        from pipeline.lookup.layers import tokens

        return tokens.read_table(str(out))
    return pq.read_table(f"{out}/{table}")


def run_cli(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    from pipeline import cli

    # Only our verb: the test must not depend on other areas' registrars.
    monkeypatch.setattr(cli, "REGISTRARS", ("pipeline.embed_cli",))
    return cli.main(argv)


def dataset_files(out: Path) -> dict[str, pa.Table]:
    files = sorted(out.glob("*/shard=*/*.parquet"))
    return {str(p.relative_to(out)): pq.read_table(p) for p in files}



def assert_same_dataset(a: Path, b: Path) -> None:
    """Same files, same rows in the same order; layers equal up to the storage rounding
    (one float16 ulp, or one int8 step) of float32 results computed with another torch
    thread count."""
    fa, fb = dataset_files(a), dataset_files(b)
    assert fa.keys() == fb.keys()
    for key, table in fa.items():
        other = fb[key]
        layers = [n for n in table.column_names if n.startswith("layer_")]
        assert table.drop_columns(layers).equals(other.drop_columns(layers)), key
        for name in layers:
            if name.endswith("_scale"):
                continue
            x, y = (_as_float(t, name) for t in (table, other))
            step = (np.abs(x).max(axis=1, keepdims=True) / 127 * 1.01 if f"{name}_scale" in
                    table.column_names else 0.0)
            excess = np.abs(x - y) - (2e-3 + 2e-3 * np.abs(y) + step)
            assert excess.max(initial=0) <= 0, (key, name, float(excess.max()))


def _as_float(table: pa.Table, name: str) -> np.ndarray:
    values = np.stack(table[name].to_numpy(zero_copy_only=False)).astype(np.float32)
    scale = f"{name}_scale"
    return values * table[scale].to_numpy()[:, None] if scale in table.column_names else values


TINY_OPTIONS = {
    "lstm": {"n_layers": 2, "dim": 32, "projection_dim": 16, "cell_clip": 3, "proj_clip": 3,
             "use_skip_connections": True},
    "char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 8], [2, 8], [3, 16]], "n_highway": 1,
                 "n_characters": 262, "max_characters_per_token": 50, "activation": "relu"},
    "training": {"batch_size": 16, "unroll_steps": 10, "n_tokens_vocab": 40,
                 "n_negative_samples": 0, "dropout": 0.0, "lr": 0.015, "clip_norm": 1.0,
                 "warmup_steps": 1,
                 "heldout_percent": 10.0},
}

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the bird"]
VERBS = ["sat on", "looked at", "ran to", "slept near"]
OBJECTS = ["the mat", "a tree", "the house", "the river", "a chair"]


def write_tiny_options(directory: Path, **training: object) -> Path:
    options = json.loads(json.dumps(TINY_OPTIONS))
    options["training"].update(training)
    path = directory / "tiny.json"
    path.write_text(json.dumps(options))
    return path


def write_toy_corpus(directory: Path, n_lines: int = 300, seed: int = 0) -> str:
    """A regular little language: a trainable LM drops far below uniform perplexity."""
    rng = random.Random(seed)
    lines = [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ."
             for _ in range(n_lines)]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "toy.txt").write_text("\n".join(lines) + "\n")
    return str(directory / "*.txt")


# LSTM step tests: small, with sizes that are not powers of two, and clips low enough to
# be hit often.
STEP_TEST_CONFIG = BiLMConfig(n_layers=2, lstm_dim=40, projection_dim=12, cell_clip=0.5,
                              proj_clip=0.3, char_embedding_dim=4,
                              filters=((1, 4), (2, 8), (3, 20)), n_highway=2)
STEP_TEST_LENGTHS = np.array([5, 2, 7, 1, 4, 7, 3])


def layer_plan_input(seed: int = 0) -> tuple[BiLstmLayer, PackPlan, torch.Tensor,
                                              tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)
    layer = BiLstmLayer(STEP_TEST_CONFIG).eval()
    with torch.no_grad():
        layer.bias.normal_(0.0, 0.5)
        layer.recurrent_weight.mul_(4)  # large enough that both clips bite
        layer.projection.mul_(8)
    plan = PackPlan.build(STEP_TEST_LENGTHS)
    x = torch.randn(2, plan.n_tokens, STEP_TEST_CONFIG.projection_dim)
    batch, p, d = len(STEP_TEST_LENGTHS), STEP_TEST_CONFIG.projection_dim, STEP_TEST_CONFIG.lstm_dim
    state = (torch.randn(2, batch, p) * 0.2, torch.randn(2, batch, d) * 0.4)
    return layer, plan, x, state


def run_layer(layer: BiLstmLayer, plan: PackPlan, x: torch.Tensor, state, step: LstmStep,
         dtype: torch.dtype | None = None):
    with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.bfloat16,
                                                enabled=dtype is not None):
        return layer(x, plan, state[0], state[1], step)


def moto_fs(endpoint: str, monkeypatch: pytest.MonkeyPatch):
    """An s3fs file system on the moto server at ``endpoint`` (the ``s3_endpoint`` fixture),
    with the test credentials also in the environment (for LanceDB and pyarrow)."""
    import s3fs

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    return s3fs.S3FileSystem(key="testing", secret="testing",
                             client_kwargs={"endpoint_url": endpoint})


def uncommit_shard_1(dataset: Path) -> tuple[Path, bytes]:
    """Takes shard 1's commit record out of ``dataset`` (its files stay): the record's path
    and bytes, to write back and commit the shard again."""
    record = next(next((dataset / "_manifest").iterdir()).glob("shard=1*"))
    kept = record.read_bytes()
    record.unlink()
    return record, kept


@contextlib.contextmanager
def local_ray_cluster(factory: pytest.TempPathFactory, head_cpus: int = 1,
                      worker_cpus: int = 1) -> Iterator[str]:
    """A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and one
    worker node, each its own raylet); yields its address. This process does not join
    it (``ray.init(address=...)`` does; leave with ``ray.shutdown`` before the end)."""
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from ray.cluster_utils import Cluster

    # A short temp dir: Ray's socket paths must stay under the 107-byte AF_UNIX limit.
    temp = factory.mktemp("rc")
    (temp / "ray").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", str(temp))
        made = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus})
        try:
            made.add_node(num_cpus=worker_cpus)
            made.wait_for_nodes()
            yield made.address
        finally:
            made.shutdown()


def flip_keeping_mtime(path: Path, offset: int) -> None:
    """One byte changed in place, the modification time put back (what rot looks like
    to a check keyed by mtime)."""
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x10]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns


def layer_page_offset(path: Path, column: str) -> int:
    """An offset inside the data of ``column``'s first page (past its page header)."""
    meta = pq.read_metadata(path)
    group = meta.row_group(0)
    chunk = next(group.column(i) for i in range(group.num_columns)
                 if group.column(i).path_in_schema.startswith(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    return start + chunk.total_compressed_size // 2
