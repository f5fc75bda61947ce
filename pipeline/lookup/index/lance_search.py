"""One nearest-neighbour search on a sense index's LanceDB table, run cheaply.

``SenseIndex.vector_query`` describes a search as a ``VectorSearch`` (query vectors, k,
columns, prefilter, and the ANN settings or exact); ``to_arrow`` runs it. LanceDB's sync
query API costs several milliseconds of Python per call around a search of a few: it
turns the vector into a Python list twice, validates a pydantic ``Query``, reads the
table's schema, and hands each step to a background event loop thread and back. Here the
same query is put straight to the table's async API (the vectors as one Arrow array each)
and run on an event loop owned by the calling thread, one hop in all. The rows and
distances are those of the sync query with the same settings (``lancedb_query`` builds it,
and the tests compare the two).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from pipeline.lookup.index.meta import SearchParams

DISTANCE = "cosine"
DISTANCE_COLUMN = "_distance"

_local = threading.local()


def run_async(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` on this thread's own event loop (made on first use), or on
    LanceDB's background loop when this thread is already inside a running loop (where a
    second loop cannot run)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        from lancedb.background_loop import LOOP

        return LOOP.run(coroutine)
    loop = getattr(_local, "loop", None)
    # A forked child inherits the parent's loop object but not its selector's state.
    if loop is None or loop.is_closed() or _local.pid != os.getpid():
        loop = asyncio.new_event_loop()
        _local.loop, _local.pid = loop, os.getpid()
    return loop.run_until_complete(coroutine)


@dataclass(frozen=True)
class VectorSearch:
    """A search of ``table`` (a LanceDB table) for the ``k`` nearest rows by cosine to each
    of ``vectors`` (``[n, dim]`` float32): ``columns`` plus ``_distance``, nearest first,
    and with more than one vector a ``query_index`` column (the vector's row). ``where``
    is a prefilter; ``ann`` the graph settings, or None for an exact scan; ``then`` a
    step on the rows found."""

    table: Any
    vectors: np.ndarray
    k: int
    columns: Sequence[str]
    where: str | None = None
    ann: SearchParams | None = None
    # Applied to the rows found (``to_arrow``): the index adds what its rows do not hold,
    # such as the sentence text kept in a table of its own.
    then: Callable[[pa.Table], pa.Table] | None = None

    def to_arrow(self) -> pa.Table:
        """Run the search (the fast path)."""
        found = run_async(self._async_query().to_arrow())
        return found if self.then is None else self.then(found)

    def _async_query(self) -> Any:
        import pyarrow as pa

        # The sync table's own async handle: its open dataset and index caches are shared.
        table = self.table._table
        vectors = [pa.array(v) for v in self.vectors]
        query = table.query().nearest_to(vectors if len(vectors) > 1 else vectors[0])
        query = query.distance_type(DISTANCE)
        if self.ann is None:
            query = query.bypass_vector_index()
        else:
            query = query.nprobes(self.ann.nprobes).maximum_nprobes(self.ann.nprobes)
            query = query.ef(self.ann.ef)
            if self.ann.refine_factor:
                query = query.refine_factor(self.ann.refine_factor)
        if self.where is not None:
            query = query.where(self.where)
        return query.select([*self.columns, DISTANCE_COLUMN]).limit(self.k)

    def lancedb_query(self) -> Any:
        """The same search through LanceDB's sync query builder (the plain path)."""
        vectors = self.vectors
        query = self.table.search(vectors[0] if len(vectors) == 1 else list(vectors)
                                  ).distance_type(DISTANCE)
        if self.ann is None:
            query = query.bypass_vector_index()
        else:
            query = query.nprobes(self.ann.nprobes).ef(self.ann.ef)
            if self.ann.refine_factor:
                query = query.refine_factor(self.ann.refine_factor)
        if self.where is not None:
            query = query.where(self.where, prefilter=True)
        return query.select([*self.columns, DISTANCE_COLUMN]).limit(self.k)
