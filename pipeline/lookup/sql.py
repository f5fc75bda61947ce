"""SQL over a dataset with DuckDB: views over the committed Parquet files, plus functions.

    con = connect("data/ds")
    con.sql("SELECT token, count(*) FROM tokens GROUP BY ALL ORDER BY 2 DESC LIMIT 5").show()
    con.execute("SELECT * FROM tokens WHERE token = $w", {"w": "bank"})

Views: ``tokens`` (with ``layer_0..layer_L`` as ``FLOAT[]``: DuckDB widens float16; from
schema version 3 layer 0 is joined in from the ``types`` files and int8 layers are
multiplied by their scales),
``sentences``, ``documents`` (its metadata fields also as typed columns), ``errors``, each
with the hive column ``shard``; and the derived tables (``schemas/derived_tables.py``):
``senses``, which ``elmo senses label`` writes (empty until a word is labelled), and
``sentence_vectors`` / ``document_vectors``, which ``elmo pool`` writes. Only files of
committed shards (and listed derived files) are in the views, so a query never sees a
half-written run.

Functions:

- ``elmo_mix(layer_0, ..., layer_L, mix)``: the mixed vector as ``FLOAT[dim]`` (an Arrow
  UDF: the lists arrive as Arrow buffers and are mixed by numpy in one vectorised call per
  chunk, far faster than pure-SQL list arithmetic). ``mix`` is a mix name
  (``top``, ``average``, ``layer:<k>``, a stored mix) or an inline JSON object.
- ``elmo_cosine(a, b)``: cosine similarity of two vectors (lists or arrays).
- ``elmo_vector(doc_id, sent_idx, tok_idx, mix)``: the mixed vector of one stored token
  (a scalar subquery macro), to compare every token against one occurrence.

For repeated queries over one mix, ``materialize_mix(con, ds, "top")`` (``elmo sql --mix
top``) precomputes table ``mix_top`` (doc_id, sent_idx, tok_idx, token, vector
FLOAT[dim]) with elmo's own Parquet reader, which is far faster than decoding the layer
lists inside DuckDB (BENCHMARKS.md).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError
from pipeline.lookup.doc_fields import DocumentTable
from pipeline.lookup.layers.mixes import iter_mixed, mix_arrays
from pipeline.lookup.layers.tokens import types_path
from schemas import (
    HALF_LAYER_0,
    PARTITION_COLUMN,
    SCALE_SUFFIX,
    TABLE_SCHEMAS,
    TYPES_SINCE_VERSION,
)
from schemas.dataset import Dataset, open_dataset
from schemas.layers import dequantize_int8_sql
from schemas.mix_specs import Mix

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from schemas.verify import VerifiedFiles

VIEWS = ("tokens", "sentences", "documents", "errors")
# Derived tables (``derived_tables``): a view each, empty until something is written.
DERIVED_VIEWS = ("senses", "sentence_vectors", "document_vectors")


def _list_values(column: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    """``[n, dim]`` float32 view of a DuckDB ``FLOAT[]``/``FLOAT[dim]`` argument."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()  # one chunk per UDF call in practice: no copy
    if column.null_count:
        raise ElmoUserError("elmo_mix: a layer argument is NULL")
    if pa.types.is_fixed_size_list(column.type):
        values = column.flatten()
    else:
        offsets = column.offsets.to_numpy()
        lengths = np.diff(offsets)
        if len(lengths) and (lengths.min() != dim or lengths.max() != dim):
            raise ElmoUserError(f"elmo_mix: layer vectors must have {dim} values")
        values = column.flatten()
    return values.to_numpy(zero_copy_only=False).reshape(len(column), dim)


def _register_functions(con: duckdb.DuckDBPyConnection, ds: Dataset) -> None:
    import duckdb
    import pyarrow as pa
    import pyarrow.compute as pc

    n_layers, dim = ds.descriptor.n_output_layers, ds.descriptor.dim
    cache: dict[str, Mix] = {}

    def resolve(spec: str) -> Mix:
        if spec not in cache:  # a stored mix is read once per connection
            cache[spec] = ds.mix(spec)
        return cache[spec]

    # No annotations here: DuckDB evaluates a UDF's annotations, and pyarrow is only
    # imported locally (string annotations would not resolve).
    def elmo_mix(*args):  # type: ignore[no-untyped-def]
        *layers, names = args
        names = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
        n = len(names)
        unique = pc.unique(names).to_pylist()
        if None in unique:
            raise ElmoUserError("elmo_mix: the mix name is NULL")
        if len(unique) == 1:
            mix = resolve(unique[0])
            arrays = [_list_values(layers[k], dim) if k in mix.used_layers else None
                      for k in range(n_layers)]
            out = mix_arrays(arrays, mix)
        else:  # several mixes in one column: mix each group of rows separately
            out = np.empty((n, dim), np.float32)
            full = [_list_values(layer, dim) for layer in layers]
            names_np = np.asarray(names.to_pylist(), dtype=object)
            for spec in unique:
                rows = np.flatnonzero(names_np == spec)
                out[rows] = mix_arrays([a[rows] for a in full], resolve(spec))
        return pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)), dim)

    # DuckDB checks the arity through inspect.signature, which honours __signature__:
    # one function serves any number of layers.
    params = [inspect.Parameter(f"layer_{k}", inspect.Parameter.POSITIONAL_ONLY)
              for k in range(n_layers)]
    params.append(inspect.Parameter("mix", inspect.Parameter.POSITIONAL_ONLY))
    elmo_mix.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    float_list = duckdb.list_type(duckdb.sqltype("FLOAT"))
    con.create_function(
        "elmo_mix", elmo_mix, [float_list] * n_layers + [duckdb.sqltype("VARCHAR")],
        duckdb.array_type(duckdb.sqltype("FLOAT"), dim), type="arrow",
    )
    con.execute("CREATE OR REPLACE MACRO elmo_cosine(a, b) AS "
                "list_cosine_similarity(a::FLOAT[], b::FLOAT[])")
    layer_args = ", ".join(f"layer_{k}" for k in range(n_layers))
    con.execute(
        "CREATE OR REPLACE MACRO elmo_vector(d, s, t, m) AS ("
        f"SELECT elmo_mix({layer_args}, m) FROM tokens "
        "WHERE doc_id = d AND sent_idx = s AND tok_idx = t LIMIT 1)"
    )


def connect(dataset: str | Dataset, con: duckdb.DuckDBPyConnection | None = None,
            storage_options: dict | None = None, threads: int | None = None,
            documents: DocumentTable | None = None,
            damaged: Mapping[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the dataset's views and the ``elmo_*`` functions;
    ``documents``: the dataset's documents already read (a server shares them);
    ``damaged``: derived view -> what is wrong with its files (``require_intact``'s
    ``derived_problems``): such a view fails with that line when a query reads it."""
    import duckdb
    import pyarrow as pa

    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, storage_options)
    con = con or duckdb.connect()
    if threads:
        con.execute(f"SET threads = {int(threads)}")  # int(): nothing else reaches the SQL
    if not ds.is_local:
        con.register_filesystem(ds.fs)
    columns: dict[str, list[str]] = {}
    for view in VIEWS:
        paths = ds.paths(view)
        if not ds.is_local:  # DuckDB reads these through the fsspec file system registered
            paths = [ds.uri_of(path) for path in paths]
        if not paths:
            continue
        # The relation API takes the file list as values: nothing is pasted into SQL text.
        if view == "tokens" and ds.descriptor.schema_version >= TYPES_SINCE_VERSION:
            relation = _v3_tokens(con, ds, paths)
        else:
            relation = con.read_parquet(paths, hive_partitioning=True)
        if view == "documents":
            relation = _typed_documents(con, documents or DocumentTable(ds), relation)
        relation.create_view(view, replace=True)
        columns[view] = list(relation.columns)
    if not columns:
        raise ElmoUserError(f"{ds.uri} has no committed shards yet")
    for view in set(TABLE_SCHEMAS) - set(columns):
        # A table without rows has no files (docs/dataset_format.md): an empty view keeps
        # e.g. `SELECT * FROM errors` valid on a clean dataset.
        empty = TABLE_SCHEMAS[view].empty_table()
        empty = empty.append_column(PARTITION_COLUMN, pa.array([], pa.int64()))
        con.from_arrow(empty).create_view(view, replace=True)
    derived_views(con, ds, damaged or {})
    layers = [f"layer_{k}" for k in range(ds.descriptor.n_output_layers)]
    if layers and all(c in columns.get("tokens", []) for c in layers):
        _register_functions(con, ds)
    return con


def derived_views(con: duckdb.DuckDBPyConnection, ds: Dataset,
                   damaged: Mapping[str, str]) -> None:
    """A view per derived table over the files its registry lists (an empty one when
    none): ``senses`` joins ``tokens`` and ``documents`` on ``doc_id, sent_idx, tok_idx``.
    A view whose files are damaged (``damaged``) or missing fails with one line naming
    the fix when a query reads it; the other views are unaffected."""
    from schemas.derived_tables import DERIVED_SCHEMAS, derived_entries, derived_fix

    for view in DERIVED_VIEWS:
        problem = damaged.get(view)
        if problem is None:
            missing = [(key, entry["path"]) for key, entry
                       in sorted(derived_entries(ds.fs, ds.root, view).items())
                       if not ds.fs.exists(f"{ds.root}/{entry['path']}")]
            if missing:
                key, path = missing[0]
                problem = (f"{len(missing)} file(s) of {view} missing, first {path} ({view} "
                           f"of {key!r}): write it again with {derived_fix(view, key)}")
        empty = con.from_arrow(DERIVED_SCHEMAS[view]().empty_table())
        if problem is not None:
            con.execute(_failing_view(view, empty, f"{ds.uri}: {problem}"))
            continue
        paths = ds.paths(view)
        if not ds.is_local:
            paths = [ds.uri_of(path) for path in paths]
        relation = con.read_parquet(paths) if paths else empty
        relation.create_view(view, replace=True)


def _failing_view(view: str, columns: Any, message: str) -> str:
    """SQL of a view with ``columns``' names and types that fails with ``message`` when a
    query reads it: every column and the row's filter call ``error()``, so no plan (a
    count, a filter, a join) can answer from it without raising; ``error()`` runs on
    scan, not when the view is made."""
    # Worded as our errors raised inside DuckDB are, so that ``_one_line`` unwraps it.
    fail = "error('ElmoUserError: " + message.replace("'", "''") + "')"
    select = ", ".join(f'CAST({fail} AS {kind}) AS "{name}"'
                       for name, kind in zip(columns.columns, columns.types, strict=True))
    return (f'CREATE OR REPLACE VIEW "{view}" AS SELECT {select} FROM (SELECT 1) '
            f"WHERE {fail} IS NULL")


SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "string": "VARCHAR"}


def _typed_documents(con: duckdb.DuckDBPyConnection, documents: DocumentTable,
                     relation: Any) -> Any:
    """The ``documents`` view with each metadata field as a typed column after the stored
    ones (``year`` BIGINT, ``president`` VARCHAR; ``metadata`` kept): the kinds search and
    clustering see (``DocumentTable.kinds``: all integers, all numbers, else text). A field
    named like a stored column (in any case: DuckDB's names are) stays in ``metadata``."""
    taken = {c.lower() for c in relation.columns}
    selected = []
    for name, kind in documents.kinds.items():
        if name.lower() in taken or any(c in name for c in '"\\') or \
                any(ord(c) < 32 for c in name):
            continue
        taken.add(name.lower())
        path = "'$.\"" + name.replace("'", "''") + "\"'"
        column = '"' + name.replace('"', '""') + '"'
        value = f"json_extract_string(metadata, {path})"
        selected.append(value + f" AS {column}" if kind == "string"
                        else f"TRY_CAST({value} AS {SQL_TYPES[kind]}) AS {column}")
    if not selected:
        return relation
    relation.create_view("elmo_document_rows", replace=True)
    return con.sql(f"SELECT *, {', '.join(selected)} FROM elmo_document_rows")


def _dequantized(column: str, names: list[str]) -> str:
    """SQL for a stored vector column as FLOAT[] (int8 values times their scale)."""
    if column + SCALE_SUFFIX in names:
        return dequantize_int8_sql(column, column + SCALE_SUFFIX)
    return column


def _v3_tokens(con: duckdb.DuckDBPyConnection, ds: Dataset, paths: list[str]) -> Any:
    """The ``tokens`` view of a version 3 dataset: columns as in versions 1/2, layer 0
    joined in from each file's own types file (the plain join docs/dataset_format.md
    shows) and int8 layers widened to FLOAT[]."""
    rows = con.read_parquet(paths, hive_partitioning=True, filename=True)
    if not any(c.startswith("layer_") for c in rows.columns):  # files that keep no layers
        return con.read_parquet(paths, hive_partitioning=True)
    types = con.read_parquet([types_path(p) for p in paths], filename=True)
    rows.create_view("elmo_token_rows", replace=True)
    types.create_view("elmo_type_rows", replace=True)
    keys = ["doc_id", "sent_idx", "tok_idx", "token", "char_start", "char_end"]
    select = [f"t.{k}" for k in keys]
    if HALF_LAYER_0 in types.columns:
        half = _dequantized(f"y.{HALF_LAYER_0}", [f"y.{c}" for c in types.columns])
        select.append(f"list_concat({half}, {half}) AS layer_0")
    else:
        select.append(_dequantized("y.layer_0", [f"y.{c}" for c in types.columns])
                      + " AS layer_0")
    for k in range(1, ds.descriptor.n_output_layers):
        select.append(_dequantized(f"t.layer_{k}", [f"t.{c}" for c in rows.columns])
                      + f" AS layer_{k}")
    select.append(f"t.{PARTITION_COLUMN}")
    # A tokens file's types file is the same shard=k/<part>.parquet under types/.
    return con.sql(
        f"SELECT {', '.join(select)} FROM elmo_token_rows t JOIN elmo_type_rows y "
        "ON y.token = t.token AND y.filename = "
        "regexp_replace(t.filename, '/tokens/([^/]+/[^/]+)$', '/types/\\1')")


def materialize_mix(con: duckdb.DuckDBPyConnection, dataset: str | Dataset, mix: str | Mix,
                    table: str | None = None) -> str:
    """Precompute one mix into relation ``mix_<name>`` (or ``table``); returns its name.

    The mixed vectors stay an Arrow table in this process, registered on the connection:
    DuckDB scans Arrow in place, so there is no ingest (a ``CREATE TABLE`` copy of the
    vectors cost more than mixing them), and queries over it ran faster than over a
    DuckDB table. It lives as long as ``con``."""
    import pyarrow as pa

    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    resolved = ds.mix(mix) if not isinstance(mix, Mix) else mix
    name = table or "mix_" + re.sub(r"[^A-Za-z0-9_]", "_", resolved.name)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ElmoUserError(f"bad table name {name!r}")
    dim = ds.descriptor.dim
    schema = pa.schema([("doc_id", pa.string()), ("sent_idx", pa.int32()),
                        ("tok_idx", pa.int32()), ("token", pa.string()),
                        ("vector", pa.list_(pa.float32(), dim))])

    batches = []
    for meta, vectors in iter_mixed(ds, resolved):
        vec = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
        batches.append(pa.RecordBatch.from_arrays([*meta.columns, vec], schema=schema))
    con.register(name, pa.Table.from_batches(batches, schema=schema))
    return name


def run_query(dataset: str, query: str, params: dict[str, Any] | None = None,
              mixes: Sequence[str] = (), check: str = "changed") -> pa.Table:
    """One query's result as an Arrow table (malformed SQL -> ``ElmoUserError``).

    Each of ``mixes`` is first precomputed into table ``mix_<name>`` (``materialize_mix``),
    so that the query can compare vectors with DuckDB's ``array_*`` functions. DuckDB
    does not check Parquet page checksums, so the files are checked first (``check``):
    ``changed`` reads the file versions not found intact lately (``require_intact``),
    ``all`` reads every file, ``none`` nothing (``elmo sql --no-verify``)."""
    import duckdb

    if check not in ("changed", "all", "none"):
        raise ValueError(f"check must be changed, all or none, not {check!r}")
    damaged = {} if check == "none" else checked_damage(dataset,
                                                        remember=check == "changed")
    try:
        con = connect(dataset, damaged=damaged)
    except duckdb.Error as error:  # e.g. unreadable Parquet behind a view
        raise connection_error(dataset, error) from None
    try:
        if mixes:
            ds = open_dataset(dataset)
            for spec in mixes:
                materialize_mix(con, ds, spec)
        return con.sql(query, params=params or None).to_arrow_table()
    except duckdb.Error as error:
        raise query_error(con, dataset, query, error) from None
    finally:
        con.close()


def checked_damage(dataset: str, storage_options: dict | None = None,
                   remember: bool = True, known: VerifiedFiles | None = None
                   ) -> dict[str, str]:
    """The dataset's files checked before DuckDB reads them (``require_intact``, its
    ``remember`` and ``known``: a damaged committed file raises); what it returns is each
    damaged derived view's first problem, for ``connect``/``derived_views``."""
    from schemas.verify import require_intact

    report = require_intact(dataset, storage_options, remember=remember, known=known)
    damaged: dict[str, str] = {}
    for problem in report.derived_problems:
        damaged.setdefault(problem.table, problem.line())
    return damaged


def query_error(con: duckdb.DuckDBPyConnection, dataset: str, query: str,
                error: Exception) -> ElmoUserError:
    """A failed query's one-line error, saying so when it needs layers the dataset lacks."""
    message = _one_line(error)
    names = {r[0] for r in con.sql("SELECT function_name FROM duckdb_functions()"
                                   " WHERE function_name = 'elmo_mix'").fetchall()}
    if not names and ("elmo_" in query or "layer_" in query):
        message += f" ({dataset} stores no layer columns, so no elmo_* functions)"
    return ElmoUserError(message)


def connection_error(dataset: str, error: Exception) -> ElmoUserError:
    """A connection that could not be made (e.g. unreadable Parquet behind a view)."""
    return ElmoUserError(f"{dataset}: {_one_line(error)}")


def _one_line(error: Exception) -> str:
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    head = lines[0] if lines else type(error).__name__
    marker = "ElmoUserError: "
    if marker in head:  # our own message raised inside a UDF: DuckDB wraps it; unwrap
        return head.split(marker, 1)[1]
    # DuckDB puts "LINE 1: <sql>" and a caret below the message: keep the position only.
    where = next((line for line in lines[1:] if line.startswith("LINE ")), "")
    return f"SQL: {head}" + (f" ({where.split(':', 1)[0]})" if where else "")
