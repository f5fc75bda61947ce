"""User SQL on a DuckDB connection that can only read the dataset.

The connection gets the dataset's views and ``elmo_*`` functions (``sql.connect``), then
is locked: external access off except the dataset's own directory (the views' files),
the configuration frozen (no ``SET``), and only single ``SELECT`` statements reach it:
DuckDB's own parser says what kind a statement is, so ``COPY``, ``ATTACH``, ``INSTALL``,
``LOAD``, ``PRAGMA``, ``CREATE`` and the rest are refused before they run. Each query has
a time limit (``interrupt``) and a row limit.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.doc_fields import DocumentTable
from pipeline.lookup.layers.mixes import Dataset
from pipeline.lookup.serve.limits import (
    MAX_SQL_CHARS,
    SQL_MAX_RESULT_BYTES,
    SQL_MAX_ROWS,
    SQL_TIMEOUT_S,
)
from pipeline.lookup.sql import _one_line, connect

if TYPE_CHECKING:
    import pyarrow as pa

# EXPLAIN shows a plan and runs nothing: harmless, and useful to see why a query is slow.
ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")


@dataclass
class SqlResult:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool  # more rows than the limit; only the first ones are here


class GuardedSql:
    """One locked connection; queries run one at a time (DuckDB connections are not
    shared across threads)."""

    def __init__(self, ds: Dataset, timeout_s: float = SQL_TIMEOUT_S,
                 max_rows: int = SQL_MAX_ROWS, documents: DocumentTable | None = None
                 ) -> None:
        import duckdb

        self.timeout_s, self.max_rows = timeout_s, max_rows
        self.con = connect(ds, con=duckdb.connect(), threads=1, documents=documents)
        if ds.is_local:
            root = os.path.abspath(ds.root).rstrip("/") + "/"
            # Before external access goes off: the views read these files on every query.
            quoted = "'" + root.replace("'", "''") + "'"  # SET takes no parameters
            self.con.execute(f"SET allowed_directories = [{quoted}]")
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

    def run(self, query: str, params: dict[str, Any] | None = None) -> SqlResult:
        import duckdb
        import pyarrow as pa

        with self.lock:
            self.check(query)
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
            except (duckdb.Error, pa.ArrowException) as error:
                raise ElmoUserError(_one_line(error)) from None
            finally:
                timer.cancel()
        truncated = table.num_rows > self.max_rows
        table = table.slice(0, self.max_rows)
        if table.nbytes > SQL_MAX_RESULT_BYTES:
            raise ElmoUserError(f"the result is over {SQL_MAX_RESULT_BYTES >> 20} MB; select "
                                "fewer columns or rows")
        return SqlResult(table.column_names, [list(r.values()) for r in table.to_pylist()],
                         truncated)

    def execute(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The server's own parameterised queries (no guard: the text is ours)."""
        with self.lock:
            return self.con.execute(query, params).fetchall()

    def close(self) -> None:
        self.con.close()


def _first_rows(reader: Any, limit: int) -> pa.Table:
    import pyarrow as pa

    batches, n = [], 0
    for batch in reader:
        batches.append(batch)
        n += batch.num_rows
        if n >= limit:
            break  # the rest is never computed
    if not batches:
        return reader.schema.empty_table()
    return pa.Table.from_batches(batches).slice(0, limit)

