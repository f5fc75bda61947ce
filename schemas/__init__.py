"""Versioned Arrow schemas of the stored datasets (see ``docs/dataset_format.md``)."""

from schemas.tables import (
    DATASET_FORMAT,
    DESCRIPTOR_FILE,
    DOCUMENT_SCHEMA,
    ERROR_SCHEMA,
    PARTITION_COLUMN,
    SCHEMA_VERSION,
    SENTENCE_SCHEMA,
    STORAGE_DTYPES,
    TABLE_SCHEMAS,
    TABLES,
    DatasetDescriptor,
    layer_columns,
    token_schema,
)

__all__ = [
    "DATASET_FORMAT",
    "DESCRIPTOR_FILE",
    "DOCUMENT_SCHEMA",
    "ERROR_SCHEMA",
    "PARTITION_COLUMN",
    "SCHEMA_VERSION",
    "SENTENCE_SCHEMA",
    "STORAGE_DTYPES",
    "TABLES",
    "TABLE_SCHEMAS",
    "DatasetDescriptor",
    "layer_columns",
    "token_schema",
]
