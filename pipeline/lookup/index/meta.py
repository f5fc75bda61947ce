"""The sense index's constants and metadata (``_elmo_index.json``): the bottom of the
``pipeline.lookup.index`` package, imported by every other module of it and importing
none of them but ``words``. ``sense_index`` describes the index as a whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.index.words import WordSelection
from schemas.dataset import open_fs
from schemas.mix_specs import Mix

INDEX_META = "_elmo_index.json"
# token_lower -> rows, so that routing a filtered query (exact or graph) costs no query.
WORD_COUNTS = "_word_counts.parquet"
INDEX_FORMAT = "elmo-store/sense-index"
TABLE = "tokens"
HNSW_MIN_ROWS = 50_000
# A prefilter leaving at most this many floats (rows x dim) is answered by an exact scan
# of those rows: 2,000 rows at 256-d, 500 at 1024-d. At 1M x 1024 an exact scan of 500-2,000
# rows cost several times the prefiltered graph search, which still finds 0.98
# (BENCHMARKS.md, "Prefilter routing").
EXACT_FILTER_VALUES = 512_000
# A filter on a field the index lacks becomes "doc_id IN (...)" of at most this many ids.
MAX_JOIN_IDS = 100_000
# A server holds the sentence texts of an index of at most this many sentences in memory
# (about 200 bytes each with their keys): its answers then read no sentences table.
HELD_SENTENCES_MAX = 2_000_000
# From this many rows on, fewer partitions are probed (see SearchParams.for_rows).
LARGE_INDEX_ROWS = 300_000
INDEX_KINDS = ("auto", "hnsw", "flat")
# What a new index is made as unless told (--full / --compact, a job's index_compact): a
# compact one is 0.3-0.4x its dataset's bytes where a full one is 3.3-3.5x, at the same
# recall@10, and builds 1.7-2.5x faster; it opens slower (the vectors are read from the
# dataset) and needs the dataset readable. BENCHMARKS.md, "Compact indexes".
NEW_INDEX_COMPACT = True
RESULT_COLUMNS = ["token", "doc_id", "sent_idx", "tok_idx", "sentence", "start", "end", "part",
                  "shard"]
# Fills token_stem. Recorded in the index: matching a word's forms at query time needs the
# stems the build stored, so an index without them (or with another stemmer's) is rebuilt.
STEMMER = "snowball-english"
SCALAR_COLUMNS = ("token", "token_lower", "token_stem")
# 2: vectors stored as VECTOR_DTYPE, sentence text in its own table (sentences.py);
# 1: float32 vectors and the sentence text in every token row (read as it is).
LAYOUT = 2
# 3: a compact index's token rows hold no document fields (``source``, ``meta_<name>``):
# they are read once per document from the dataset and joined by doc_id.
COMPACT_LAYOUT = 3
# float16 halves the stored vectors and keeps recall@10 (BENCHMARKS.md, "Index size").
VECTOR_DTYPE = "float16"
VECTOR_DTYPES = ("float16", "float32")


@dataclass
class SearchParams:
    """Query-time knobs of the HNSW index, chosen by bench/lookup.py (the measurements are
    in BENCHMARKS.md, "LanceDB sense index")."""

    nprobes: int = 20
    ef: int = 150  # over 100: about one point of recall@10 at 100k and 1M rows
    # Re-rank k x refine_factor candidates with the full vectors: the scalar quantizer's
    # error alone costs 3-4 points of recall@10.
    refine_factor: int | None = 5

    @classmethod
    def for_rows(cls, rows: int) -> SearchParams:
        """The defaults for an index of ``rows`` vectors.

        A query costs a fixed part plus a part per probed partition, whatever the
        partition size, while the share of partitions a query must probe for recall@10
        >= 0.95 falls as they multiply (0.3 sqrt(n) of them): 20 of ~100 at 100k rows,
        10 of 300 at 1M (BENCHMARKS.md has the table)."""
        return cls(nprobes=10) if rows >= LARGE_INDEX_ROWS else cls()


@dataclass
class IndexMeta:
    dataset: str
    model_fingerprint: str
    mix: dict[str, Any]
    mix_name: str
    dim: int
    kind: str = "auto"
    built: str = "flat"  # what exists now: flat or hnsw
    num_partitions: int | None = None
    trained_rows: int = 0  # rows when the vector index was last trained
    m: int = 20
    ef_construction: int = 300
    search: SearchParams = field(default_factory=SearchParams)
    search_auto: bool = True  # search follows the index size (False: set by the user)
    indexed: list[str] = field(default_factory=list)  # part/shard=k/run_id keys
    rows: int = 0
    counted_rows: int = 0  # rows when WORD_COUNTS was written (0: not written)
    stemmer: str = ""  # what filled token_stem ("": built before stems were stored)
    # Metadata fields stored as meta_<name> columns, name -> int/float/string (None: built
    # before document fields were stored, so rows lack even ``source``).
    doc_fields: dict[str, str] | None = None
    layout: int = 1  # LAYOUT of the rows (1: written before the field existed)
    vector_dtype: str = "float32"
    words: dict[str, Any] | None = None  # WordSelection.to_json (None: every word)
    # The in-memory IVF made beside the table (``ivf_build``, ``ivf_shards_build``; None:
    # not made). Stored as "ivf"; files written before the name read from "held".
    ivf: dict[str, Any] | None = None
    compact: bool = False  # vectors read from the dataset, quantized codes in the IVF
    # The commit (``publish``): table name -> the LanceDB version this JSON goes with, which
    # readers check out (None: written before versions were recorded, read at the latest).
    versions: dict[str, int] | None = None
    # This build's WORD_COUNTS and SELECTED_WORDS files (None: the fixed names of older
    # indexes): a build writes its own, so one stopped half way changes no published file.
    word_counts_file: str | None = None
    selected_file: str | None = None
    format: str = INDEX_FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> IndexMeta:
        data = json.loads(text)
        if data.get("format") != INDEX_FORMAT:
            raise ElmoUserError("not an elmo-store sense index")
        data["search"] = SearchParams(**data.get("search", {}))
        if "held" in data and "ivf" not in data:
            data["ivf"] = data.pop("held")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def stored_fields(self) -> dict[str, str] | None:
        """The document fields its token rows hold as columns (None: none, not even
        ``source``: they are joined by doc_id)."""
        return None if self.compact and self.layout >= COMPACT_LAYOUT \
            else self.doc_fields or {}

    def the_mix(self) -> Mix:
        return Mix.from_json(self.mix_name, self.mix)

    def selection(self) -> WordSelection:
        return WordSelection.from_json(self.words)


def stale_rows(meta: IndexMeta) -> str | None:
    """How the index of ``meta`` was built if its rows are of a storage generation before
    the current one (this version neither extends nor searches it: a build makes it again),
    else None. Searches by word form need ``token_stem``, filters the document fields;
    layout 1 rows carry their sentence's text, a compact index's before layout 3 its
    documents' fields."""
    for stale, why in ((meta.stemmer != STEMMER, f"without {STEMMER} word stems"),
                       (meta.doc_fields is None, "without document fields"),
                       (meta.layout < LAYOUT, "with the sentence text in every row"),
                       (meta.compact and meta.layout < COMPACT_LAYOUT,
                        "with its documents' fields in every row")):
        if stale:
            return why
    return None


def read_meta(out: str, storage_options: dict | None = None) -> IndexMeta | None:
    fs, root = open_fs(out, storage_options)
    try:
        with fs.open(f"{root}/{INDEX_META}", "rb") as handle:
            return IndexMeta.from_json(handle.read().decode())
    except FileNotFoundError:
        return None


def lance_options(storage_options: dict | None) -> dict[str, str] | None:
    return {k: str(v) for k, v in storage_options.items()} if storage_options else None


def build_command(meta: IndexMeta, uri: str, then: str = "") -> str:
    """The ``elmo index build`` of the index of ``meta`` at ``uri`` (its dataset and mix),
    quoted, with ``then`` (``--rebuild``, ...) after it: what error messages name as the
    fix."""
    return f"`elmo index build {meta.dataset} --mix {meta.mix_name} --out {uri}" \
        f"{' ' + then if then else ''}`"


def moved_dataset_fix(mix_name: str, uri: str) -> str:
    """What to do when the dataset of the index at ``uri`` is not where the index says."""
    return (f"put the dataset back there, or build the index again from where it is now "
            f"(`elmo index build DATASET --mix {mix_name} --out {uri} --rebuild`)")
