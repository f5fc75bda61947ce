"""User SQL on a DuckDB connection that can only read the dataset.

The connection gets the dataset's views and ``elmo_*`` functions (``sql.connect``), then
is locked: external access off except the dataset's own directory (the views' files),
the configuration frozen (no ``SET``), and only single ``SELECT`` statements reach it:
DuckDB's own parser says what kind a statement is, so ``COPY``, ``ATTACH``, ``INSTALL``,
``LOAD``, ``PRAGMA``, ``CREATE`` and the rest are refused before they run. Each query has
a time limit (``interrupt``), a row limit, a limit on its result's bytes (counted while
it streams) and DuckDB's memory is capped (half of ``--sql-memory``, no spilling to
disk). The server runs this connection in a worker process under a memory cap
(``sql_worker.py``): what DuckDB does not count cannot grow the server either.

The server's paths stay its own: only the table functions in ``TABLE_FUNCTIONS`` and no
function that reads settings or the environment may appear (DuckDB's parse tree, from
``json_serialize_sql``, says which a query calls), and any absolute path of the server
(the dataset's folder, home, working and temporary folders, DuckDB's own) that still
reaches an answer or an error is written as ``<dataset>`` or ``<server>``.

Before each query the dataset's files are checked as `elmo sql` checks them
(``require_intact``: a file version changed since it was last found intact is read
again), and the derived tables' views follow their registry (a relabelled word is
seen at the next query; a damaged or missing file fails only queries of its table).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.doc_fields import DocumentTable
from pipeline.lookup.layers.mixes import Dataset
from pipeline.lookup.serve.limits import (
    MAX_SQL_CHARS,
    SQL_MAX_RESULT_BYTES,
    SQL_MAX_ROWS,
    SQL_MEMORY_MB,
    SQL_TIMEOUT_S,
)
from pipeline.lookup.sql import _one_line, checked_damage, connect, derived_views
from schemas.derived_tables import read_registry
from schemas.user_cache import cache_dir
from schemas.verify import VerifiedFiles

if TYPE_CHECKING:
    import pyarrow as pa

# EXPLAIN shows a plan and runs nothing: harmless, and useful to see why a query is slow.
ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")
# Table functions a query may call: none reads a file or shows a setting or a path.
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest", "duckdb_columns",
                             "duckdb_tables", "duckdb_types", "duckdb_functions",
                             "duckdb_keywords"})
# Functions that read the server's settings, variables or environment.
REFUSED_FUNCTIONS = frozenset({"current_setting", "getenv", "getvariable"})
# Functions whose result grows with a number argument: DuckDB builds a vector of 2,048
# rows of it outside its memory limit, so a large constant there is refused.
SIZED_FUNCTIONS = frozenset({"repeat", "lpad", "rpad", "list_resize", "array_resize",
                             "range", "generate_series", "bar", "printf", "format"})
MAX_SIZE_ARGUMENT = 1_000_000
# Catalog views named like these show settings, databases, files or view definitions.
REFUSED_TABLE_PREFIXES = ("duckdb_", "pragma_", "pg_settings")


class SqlMemoryError(ElmoUserError):
    """A query that needed more memory than the server gives /sql."""


def memory_message(memory_mb: int) -> str:
    return (f"the query needed more than the {memory_mb:,} MB of memory this server gives "
            "/sql (--sql-memory); select fewer rows or columns, or aggregate")


def is_out_of_memory(error: BaseException) -> bool:
    """DuckDB's and Arrow's failed allocations, whatever type they surface as (an Arrow
    reader reports DuckDB's as an OSError)."""
    import duckdb

    return isinstance(error, MemoryError | duckdb.OutOfMemoryException) or \
        "Out of Memory Error" in str(error)


@dataclass
class SqlResult:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool  # more rows than the limit; only the first ones are here


class GuardedSql:
    """One locked connection; queries run one at a time (DuckDB connections are not
    shared across threads)."""

    def __init__(self, ds: Dataset, timeout_s: float = SQL_TIMEOUT_S,
                 max_rows: int = SQL_MAX_ROWS, documents: DocumentTable | None = None,
                 check_files: bool = True, memory_mb: int = SQL_MEMORY_MB) -> None:
        """``check_files``: check the dataset's files before each query (False:
        ``elmo serve --no-verify``); ``memory_mb``: what a query may take (DuckDB's
        buffer manager gets half; the worker's cap is the whole, ``sql_worker.py``)."""
        import duckdb

        self.ds, self.timeout_s, self.max_rows = ds, timeout_s, max_rows
        self.memory_mb = memory_mb
        self.known = VerifiedFiles() if check_files else None
        self.con = connect(ds, con=duckdb.connect(), threads=1, documents=documents)
        self.derived_state = self._derived_state({})
        if ds.is_local:
            root = os.path.abspath(ds.root).rstrip("/") + "/"
            # Before external access goes off: the views read these files on every query.
            quoted = "'" + root.replace("'", "''") + "'"  # SET takes no parameters
            self.con.execute(f"SET allowed_directories = [{quoted}]")
        self.con.execute(f"SET memory_limit = '{int(memory_mb) // 2}MB'")
        # No spilling to disk, and no temporary folder: DuckDB made ``.tmp/`` in the
        # working directory at a query over its limit, and a killed worker leaves it there.
        self.con.execute("SET temp_directory = ''")
        self.con.execute("SET max_temp_directory_size = '0B'")
        self.hidden = _server_paths(self.con, ds)
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET autoinstall_known_extensions = false")
        self.con.execute("SET autoload_known_extensions = false")
        self.con.execute("SET lock_configuration = true")
        self.lock = threading.Lock()

    def check(self, query: str) -> None:
        import duckdb

        if not query.strip():
            raise ElmoUserError("the query is empty")
        if len(query) > MAX_SQL_CHARS:
            raise ElmoUserError(f"the query is longer than {MAX_SQL_CHARS} characters")
        try:
            statements = self.con.extract_statements(query)
        except duckdb.Error as error:
            raise ElmoUserError(_one_line(error)) from None
        if len(statements) != 1:
            raise ElmoUserError(f"send one statement per request, not {len(statements)}")
        kind = statements[0].type.name
        if kind not in ALLOWED_STATEMENTS:
            raise ElmoUserError(f"only SELECT queries run here, not {kind}: the dataset is "
                                "served read-only")
        self._check_calls(statements[0].query if kind == "SELECT" else
                          re.sub(r"^\s*EXPLAIN\s+(ANALY[SZ]E\s+)?", "", query, flags=re.I))

    def _check_calls(self, query: str) -> None:
        """Refuse calls that could show the server's settings, files or paths."""
        try:
            tree = json.loads(self.con.execute("SELECT json_serialize_sql(?)",
                                               [query]).fetchall()[0][0])
        except Exception:  # not parsable alone: the query itself will say
            return
        for kind, name, arguments in _calls(tree):
            name = name.lower()
            if kind == "function" and name in SIZED_FUNCTIONS and \
                    max(_numbers(arguments), default=0) > MAX_SIZE_ARGUMENT:
                raise ElmoUserError(f"{name}() with a size over {MAX_SIZE_ARGUMENT:,} is not "
                                    "served here: the result would not fit the server's "
                                    "limits")
            if kind == "table function" and name not in TABLE_FUNCTIONS:
                raise ElmoUserError(f"the table function {name}() is not served here; query "
                                    "the dataset's views (tokens, sentences, documents, "
                                    "errors, senses)")
            if kind == "function" and name in REFUSED_FUNCTIONS:
                raise ElmoUserError(f"{name}() is not served here: the server's settings "
                                    "are its own")
            if kind == "table" and name.startswith(REFUSED_TABLE_PREFIXES) and \
                    name not in TABLE_FUNCTIONS:
                raise ElmoUserError(f"{name} is not served here: the server's catalog is "
                                    "its own")

    def _derived_state(self, damaged: dict[str, str]) -> tuple[Any, ...]:
        registry = read_registry(self.ds.fs, self.ds.root)
        return registry.get("generation"), sorted(damaged.items())

    def _follow_files(self) -> None:
        """The files checked (a damaged committed file stops the query) and the derived
        views made again when their registry or their damage changed."""
        damaged = {} if self.known is None else checked_damage(
            self.ds.uri, self.ds.storage_options, known=self.known)
        state = self._derived_state(damaged)
        if state != self.derived_state:
            derived_views(self.con, self.ds, damaged)
            self.derived_state = state

    def run(self, query: str, params: dict[str, Any] | None = None,
            started: Callable[[], None] | None = None) -> SqlResult:
        """``started`` is called once the query passed its checks and starts running
        (the worker's parent then times it)."""
        try:
            return self._run(query, params, started)
        except ElmoUserError as error:
            raise type(error)(self.redact(str(error))) from None

    def _run(self, query: str, params: dict[str, Any] | None,
             started: Callable[[], None] | None) -> SqlResult:
        import duckdb
        import pyarrow as pa

        with self.lock:
            self.check(query)
            self._follow_files()
            if started is not None:
                started()
            timer = threading.Timer(self.timeout_s, self.con.interrupt)
            timer.start()
            try:
                # A relation streams its own rows to Arrow; a DB-API result
                # (``execute``) copies them first, and DuckDB warns on every call.
                relation = self.con.sql(query, params=params or None)
                table = pa.table({}) if relation is None else _first_rows(
                    relation.to_arrow_reader(1024), self.max_rows + 1)
            except duckdb.InterruptException:
                raise ElmoUserError(f"the query ran longer than {self.timeout_s:g} s and was "
                                    "stopped; add a LIMIT or a WHERE") from None
            except (duckdb.Error, pa.ArrowException, OSError, MemoryError) as error:
                if is_out_of_memory(error):
                    raise SqlMemoryError(memory_message(self.memory_mb)) from None
                raise ElmoUserError(_one_line(error)) from None
            finally:
                timer.cancel()
        truncated = table.num_rows > self.max_rows
        table = table.slice(0, self.max_rows)
        return SqlResult(table.column_names,
                         [[self.redact(v) for v in r.values()] for r in table.to_pylist()],
                         truncated)

    def redact(self, value: Any) -> Any:
        """``value`` with the server's absolute paths written as placeholders."""
        if isinstance(value, str):
            for path, name in self.hidden:
                if path in value:
                    value = value.replace(path, name)
            return value
        if isinstance(value, list):
            return [self.redact(v) for v in value]
        if isinstance(value, dict):
            return {k: self.redact(v) for k, v in value.items()}
        return value

    def execute(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The server's own parameterised queries (no guard: the text is ours)."""
        with self.lock:
            return self.con.execute(query, params).fetchall()

    def close(self) -> None:
        self.con.close()


def _server_paths(con: Any, ds: Dataset) -> list[tuple[str, str]]:
    """``(absolute path, placeholder)`` for every folder of the server a query's answer or
    error could name, longest first (a path inside another is replaced whole)."""
    paths = {os.path.abspath(ds.root): "<dataset>"} if ds.is_local else {}
    found = [os.path.expanduser("~"), os.getcwd(), tempfile.gettempdir(), sys.prefix,
             str(cache_dir())]
    for (value,) in con.execute("SELECT value FROM duckdb_settings()").fetchall():
        found += re.findall(r"/[^\s'\",\]\[]+", str(value or ""))
    for path in found:
        path = os.path.abspath(path).rstrip("/")
        if len(path) > 1 and os.path.exists(path):  # "/" is in every path; "/UTC" is none
            paths.setdefault(path, "<server>")
    return sorted(paths.items(), key=lambda item: -len(item[0]))


def _calls(node: Any) -> Iterator[tuple[str, str, Any]]:
    """``(kind, name, arguments)`` of every function, table function and table a
    serialized query (``json_serialize_sql``) names."""
    if isinstance(node, dict):
        if node.get("type") == "TABLE_FUNCTION":  # it streams rows: no size to check
            function = node.get("function", {})
            yield "table function", str(function.get("function_name", "")), []
            yield from _calls(function.get("arguments", []))
            for key, value in node.items():
                if key != "function":
                    yield from _calls(value)
            return
        if node.get("class") == "FUNCTION":
            yield "function", str(node.get("function_name", "")), node.get("arguments", [])
        elif node.get("type") == "BASE_TABLE":
            yield "table", str(node.get("table_name", "")), []
        for value in node.values():
            yield from _calls(value)
    elif isinstance(node, list):
        for value in node:
            yield from _calls(value)


def _numbers(arguments: Any) -> Iterator[float]:
    """The numeric constants among a call's own arguments."""
    for argument in arguments if isinstance(arguments, list) else []:
        expression = argument.get("expression", argument) if isinstance(argument, dict) \
            else {}
        literal = expression.get("literal") if expression.get("class") == "CONSTANT" else None
        if isinstance(literal, dict):
            try:
                yield abs(float(literal.get("text", "")))
            except ValueError:
                continue


def _first_rows(reader: Any, limit: int) -> pa.Table:
    import pyarrow as pa

    batches, n, size = [], 0, 0
    for batch in reader:
        batches.append(batch)
        n += batch.num_rows
        size += batch.nbytes
        if size > SQL_MAX_RESULT_BYTES:  # counted as it streams: never more is held
            raise ElmoUserError(f"the result is over {SQL_MAX_RESULT_BYTES >> 20} MB; "
                                "select fewer columns or rows")
        if n >= limit:
            break  # the rest is never computed
    if not batches:
        return reader.schema.empty_table()
    return pa.Table.from_batches(batches).slice(0, limit)

