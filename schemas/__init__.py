"""The storage contract: what an elmo-store dataset is on disk, below both the write path
(``pipeline/write/``) and the read path (``pipeline/lookup/``), importing neither.

- ``layout``: the layout's names and versions (no pyarrow); ``tables``: the versioned
  Arrow schemas and the dataset descriptor (``_dataset.json``); ``layers``: quantization.
- ``files``: opening a URI, reading JSON, writing a file whole; ``manifest``: commit
  records and the live view; ``lock``: one writer per dataset; ``dataset``: an opened
  dataset; ``mix_specs``: what a mix is and ``_mixes.json``.
- ``verify``: every stored file checked against its commit record (``elmo dataset
  verify``); ``user_cache``: the per-user cache of what was checked.

The names below are imported on first use (``from schemas import TABLES`` loads pyarrow
only when a name needs it), so light modules stay light.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    **dict.fromkeys(("DATASET_FORMAT", "DESCRIPTOR_FILE", "HALF_LAYER_0", "PARTITION_COLUMN",
                     "SCALE_SUFFIX", "SCHEMA_VERSION", "STORAGE_DTYPES", "TABLES",
                     "TYPES_SINCE_VERSION"), "schemas.layout"),
    **dict.fromkeys(("DOCUMENT_SCHEMA", "ERROR_SCHEMA", "SENTENCE_SCHEMA", "TABLE_SCHEMAS",
                     "DatasetDescriptor", "layer_columns", "token_schema", "types_schema",
                     "vector_fields"), "schemas.tables"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
