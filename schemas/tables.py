"""Versioned Arrow schemas of an elmo-store dataset and its descriptor (``_dataset.json``).

The public contract is documented in ``docs/dataset_format.md``; this module is its
executable form. Bump ``SCHEMA_VERSION`` whenever a table's columns or their meaning
change: writers refuse to add data to a dataset of another version, so a reader never
sees two layouts mixed in one dataset.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from schemas.layout import (
    DATASET_FORMAT,
    HALF_LAYER_0,
    PARTITION_COLUMN,
    SCALE_SUFFIX,
    SCHEMA_VERSION,
    STORAGE_DTYPES,
    TYPES_SINCE_VERSION,
)


def layer_columns(n_output_layers: int) -> list[str]:
    """``layer_0`` (the context-free char-CNN layer) .. ``layer_L`` (the top biLSTM layer)."""
    return [f"layer_{k}" for k in range(n_output_layers)]


def storage_type(dtype: str) -> pa.DataType:
    """The Arrow type of one stored layer value of storage dtype ``dtype``."""
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {STORAGE_DTYPES}, not {dtype!r}")
    return {"float16": pa.float16(), "float32": pa.float32(), "int8": pa.int8()}[dtype]


def vector_fields(name: str, dim: int, dtype: str) -> list[pa.Field]:
    """A stored vector: ``name`` as a fixed-size list of ``dtype``; with int8, followed
    by ``name_scale`` (float32): value = int8 value x scale (schemas.layers)."""
    fields = [pa.field(name, pa.list_(storage_type(dtype), dim), nullable=False)]
    if dtype == "int8":
        fields.append(pa.field(name + SCALE_SUFFIX, pa.float32(), nullable=False))
    return fields


def _version_metadata(version: int) -> dict[bytes, bytes]:
    return {b"elmo_store_schema_version": str(version).encode()}


def token_schema(n_output_layers: int, dim: int, dtype: str = "float16",
                 version: int = SCHEMA_VERSION) -> pa.Schema:
    """One row per stored token; the hive partition column ``shard`` lives in the path.

    ``token == sentence_text_of_doc[char_start:char_end]`` always holds (offsets count
    Unicode code points of the document text), so tokens are never rewritten (no PTB
    quote conversion) and tokens longer than the model's 50 chars are stored whole.
    From version 3 ``layer_0`` is in the ``types`` table (``types_schema``), not here.
    """
    fields = [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("sent_idx", pa.int32(), nullable=False),
        pa.field("tok_idx", pa.int32(), nullable=False),
        pa.field("token", pa.string(), nullable=False),
        pa.field("char_start", pa.int32(), nullable=False),
        pa.field("char_end", pa.int32(), nullable=False),
    ]
    if dtype == "int8" and version < TYPES_SINCE_VERSION:
        raise ValueError(f"int8 layers need schema version {TYPES_SINCE_VERSION}")
    first = 1 if version >= TYPES_SINCE_VERSION else 0
    for name in layer_columns(n_output_layers)[first:]:
        fields += vector_fields(name, dim, dtype)
    return pa.schema(fields, metadata=_version_metadata(version))


def types_schema(dim: int, dtype: str, halved: bool) -> pa.Schema:
    """Version 3: one row per distinct token string of a tokens file, in order of first
    occurrence, with that token's ``layer_0`` (context free, so the same for every
    occurrence); ``layer_0_half`` (``dim / 2`` values) instead when the model's layer 0
    is ``[x; x]``, as ELMo's is: ``layer_0 = layer_0_half || layer_0_half``."""
    name, width = (HALF_LAYER_0, dim // 2) if halved else ("layer_0", dim)
    fields = [pa.field("token", pa.string(), nullable=False),
              *vector_fields(name, width, dtype)]
    return pa.schema(fields, metadata=_version_metadata(SCHEMA_VERSION))


SENTENCE_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("sent_idx", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("char_start", pa.int32(), nullable=False),
        pa.field("char_end", pa.int32(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("n_windows", pa.int32(), nullable=False),
    ]
)

DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # the file URI the document came from
        pa.field("line", pa.int64()),  # 1-based line / record number; null for a whole file
        pa.field("n_sentences", pa.int32(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("metadata", pa.string()),  # JSON object of extra input fields, or null
    ]
)

ERROR_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("line", pa.int64()),
        pa.field("reason", pa.string(), nullable=False),
    ]
)

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "sentences": SENTENCE_SCHEMA,
    "documents": DOCUMENT_SCHEMA,
    "errors": ERROR_SCHEMA,
}


@dataclass(frozen=True)
class DatasetDescriptor:
    """What every writer of a dataset must agree on; stored as ``_dataset.json``."""

    model_fingerprint: str
    n_output_layers: int
    dim: int
    dtype: str
    n_shards: int
    tokenizer: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)  # informative: config, source path
    schema_version: int = SCHEMA_VERSION
    format: str = DATASET_FORMAT
    shard_hash: str = ("shard k of a part = work item k of its plan.json: a byte range of one "
                       "input file owning the lines / Parquet row groups that start in it")
    partition_column: str = PARTITION_COLUMN
    compression: str = "zstd; layer_1..layer_L snappy"
    extra: dict[str, Any] = field(default_factory=dict)  # room for later issues (mixes, jobs)

    @property
    def layer_columns(self) -> list[str]:
        return layer_columns(self.n_output_layers)

    def token_schema(self) -> pa.Schema:
        return token_schema(self.n_output_layers, self.dim, self.dtype, self.schema_version)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DatasetDescriptor:
        data = json.loads(text)
        if data.get("format") != DATASET_FORMAT:
            raise ValueError(f"not an elmo-store descriptor (format={data.get('format')!r})")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def incompatibilities(self, other: DatasetDescriptor,
                          called: Callable[[str], str] = str) -> list[str]:
        """Reasons why data described by ``other`` cannot be added to this dataset;
        ``called`` says what a fix's setting is called (a CLI flag, say)."""
        problems = []
        if self.schema_version != other.schema_version:
            problems.append(
                f"schema version {self.schema_version} != {other.schema_version}"
            )
        if self.model_fingerprint != other.model_fingerprint:
            problems.append(
                f"model fingerprint {self.model_fingerprint[:12]}… != "
                f"{other.model_fingerprint[:12]}… (another model)"
            )
        for name in ("n_output_layers", "dim", "dtype", "n_shards"):  # n_shards: 0 since v2
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                problems.append(f"{name} {mine!r} != {theirs!r}")
        # The stateless start (zeros or the model's warm state) changes every vector.
        mine_start = self.model.get("initial_state", "zeros")
        theirs_start = other.model.get("initial_state", "zeros")
        if mine_start != theirs_start:
            problems.append(f"initial state {mine_start!r} != {theirs_start!r}")
        if self.tokenizer != other.tokenizer:
            mine_name, theirs_name = self.tokenizer.get("name"), other.tokenizer.get("name")
            if mine_name != theirs_name:
                problems.append(f"tokenizer {theirs_name!r} != the dataset's {mine_name!r} "
                                f"(pass {called('tokenizer')} {mine_name} to add to it)")
            else:
                problems.append(f"tokenizer settings {other.tokenizer} != the dataset's "
                                f"{self.tokenizer}")
        return problems
