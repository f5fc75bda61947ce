"""The names and versions of a dataset's layout: what a stored dataset is called on disk.

Plain constants, importable without pyarrow (``elmo --help`` and the settings' parsers
read ``STORAGE_DTYPES`` from here); the Arrow schemas built from them are
``schemas.tables``'s. docs/dataset_format.md is the public description.
"""

# 2: shards are work items (byte ranges of the inputs, numbered per part), not
#    sha256(doc_id) mod n_shards; the file layout and every table are unchanged.
# 3: ``layer_0`` moves from ``tokens`` to the ``types`` table (one row per distinct token
#    of a file; only the first half when its halves are equal); ``int8`` storage.
SCHEMA_VERSION = 3
TYPES_SINCE_VERSION = 3
DATASET_FORMAT = "elmo-store/token-activations"
DESCRIPTOR_FILE = "_dataset.json"
PARTITION_COLUMN = "shard"
TABLES = ("tokens", "sentences", "documents", "errors", "types")
STORAGE_DTYPES = ("float16", "float32", "int8")
SCALE_SUFFIX = "_scale"  # int8 layers: ``layer_k`` holds int8 values, ``layer_k_scale`` their scale
HALF_LAYER_0 = "layer_0_half"  # the types table's layer 0 when its two halves are equal
