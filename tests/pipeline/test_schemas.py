"""Versioned Arrow schemas and the dataset descriptor."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from pipeline.write.config import flag_of
from schemas import SCHEMA_VERSION, DatasetDescriptor, token_schema, types_schema


def descriptor(**changes: object) -> DatasetDescriptor:
    base = DatasetDescriptor(model_fingerprint="ab" * 32, n_output_layers=3, dim=1024,
                             dtype="float16", n_shards=8,
                             tokenizer={"name": "elmo-store-ptb", "version": "1"})
    return dataclasses.replace(base, **changes)


def test_token_schema_layers_are_fixed_size_lists() -> None:
    schema = token_schema(3, 1024, "float16")
    assert schema.names[:6] == ["doc_id", "sent_idx", "tok_idx", "token", "char_start",
                                "char_end"]
    # Version 3: layer 0 is in the types table.
    assert [n for n in schema.names if n.startswith("layer_")] == ["layer_1", "layer_2"]
    assert schema.field("layer_2").type == pa.list_(pa.float16(), 1024)
    assert token_schema(2, 8, "float32").field("layer_1").type == pa.list_(pa.float32(), 8)
    assert schema.metadata[b"elmo_store_schema_version"] == str(SCHEMA_VERSION).encode()
    old = token_schema(3, 8, "float16", version=2)
    assert [n for n in old.names if n.startswith("layer_")] == ["layer_0", "layer_1", "layer_2"]
    with pytest.raises(ValueError):
        token_schema(3, 8, "bfloat16")
    with pytest.raises(ValueError):
        token_schema(3, 8, "int8", version=2)


def test_int8_layers_carry_a_scale_and_types_hold_layer_0() -> None:
    schema = token_schema(3, 16, "int8")
    assert schema.names[6:] == ["layer_1", "layer_1_scale", "layer_2", "layer_2_scale"]
    assert schema.field("layer_1").type == pa.list_(pa.int8(), 16)
    assert schema.field("layer_1_scale").type == pa.float32()
    assert types_schema(16, "float16", halved=True).names == ["token", "layer_0_half"]
    assert types_schema(16, "float16", halved=True).field(1).type.list_size == 8
    assert types_schema(16, "int8", halved=False).names == ["token", "layer_0",
                                                             "layer_0_scale"]


def test_descriptor_round_trips_and_reports_incompatibilities() -> None:
    d = descriptor()
    assert DatasetDescriptor.from_json(d.to_json()) == d
    assert d.incompatibilities(descriptor()) == []
    other = descriptor(model_fingerprint="cd" * 32, schema_version=SCHEMA_VERSION + 1,
                       dtype="float32")
    problems = " ".join(d.incompatibilities(other))
    assert "another model" in problems
    assert "schema version" in problems
    assert "dtype" in problems
    with pytest.raises(ValueError):
        DatasetDescriptor.from_json('{"format": "something-else"}')


def test_shards_are_work_items_and_tokenizers_name_the_fix() -> None:
    assert SCHEMA_VERSION == 3 and "work item" in descriptor().shard_hash
    d = descriptor()
    other = descriptor(tokenizer={"name": "moses", "version": "1"})
    assert d.incompatibilities(other) == [
        "tokenizer 'moses' != the dataset's 'elmo-store-ptb' (pass tokenizer "
        "elmo-store-ptb to add to it)"]
    assert "(pass --tokenizer elmo-store-ptb" in d.incompatibilities(other, flag_of)[0]
    windows = descriptor(tokenizer={"name": "elmo-store-ptb", "version": "1",
                                    "max_sentence_tokens": 100})
    assert "tokenizer settings" in " ".join(d.incompatibilities(windows))
