"""A compact index's shard files read by position: the int8 vectors a query's re-rank
reads row by row (``ShardVectors``) and the mapped ``rows.arrow`` columns a result takes
(``ShardRows``); ``ivf_shards`` describes the files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from pipeline.lookup.index.row_vectors import RowFile

SHARD_VECTOR_DTYPE = "int8"
# Up to this many rows of a file are read with a call a row, more through a map.
PREAD_ROWS = 1_024
# String columns of rows.arrow stored as dictionary codes: a document's id repeats for
# each of its tokens (23 bytes a row at austen's ids, 4 as a code) and a shard holds one
# part (8 bytes a row, 1 as a code). ``ShardRows.take`` gives them back as strings.
DICTIONARY_COLUMNS = ("doc_id", "part")


def with_dictionary_codes(rows: pa.Table) -> pa.Table:
    """``rows`` with ``DICTIONARY_COLUMNS`` as dictionary codes of the narrowest integer
    type: one dictionary a column, shared by the file's batches."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in DICTIONARY_COLUMNS:
        if name not in rows.column_names or not pa.types.is_string(rows.schema.field(
                name).type):
            continue
        coded = pc.dictionary_encode(rows.column(name).combine_chunks())
        size = len(coded.dictionary)
        width = pa.int8() if size < 1 << 7 else pa.int16() if size < 1 << 15 else pa.int32()
        coded = coded.cast(pa.dictionary(width, pa.string()))
        rows = rows.set_column(rows.column_names.index(name), name, coded)
    return rows


class ShardVectors:
    """The int8 vectors of every shard as one ``[n, dim]`` array by position, whatever
    holds them (``row_vectors.RowFile``: the shard's copy or the dataset's own pages)."""

    def __init__(self, files: Sequence[RowFile], dim: int) -> None:
        import numpy as np

        self.files = list(files)
        self.offsets = np.concatenate([[0], np.cumsum([f.rows for f in self.files],
                                                      dtype=np.int64)])
        self.dtype = np.dtype(SHARD_VECTOR_DTYPE)
        self.shape = (int(self.offsets[-1]), dim)

    @classmethod
    def of_folders(cls, folders: Sequence[str], rows: Sequence[int], dim: int
                   ) -> ShardVectors:
        from pipeline.lookup.index.row_vectors import open_row_file

        return cls([open_row_file(f, n, dim) for f, n in zip(folders, rows, strict=True)],
                   dim)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, where: Any) -> np.ndarray:
        import numpy as np

        if isinstance(where, slice):
            start, stop, step = where.indices(len(self))
            if step != 1:
                raise ValueError("slices of shard vectors are contiguous")
            return self.read(start, stop)
        positions = np.asarray(where, np.int64)
        order = np.argsort(positions, kind="stable")
        found = self.read_rows(positions[order])
        out = np.empty_like(found)
        out[order] = found
        return out

    def read_rows(self, positions: np.ndarray) -> np.ndarray:
        """The rows at ``positions`` (ascending). Many rows are gathered through a map of
        each file made for this call and unmapped after it: as fast as a standing map (a
        ``pread`` a row cost 3x at thousands of rows), and the pages it touched leave the
        process's RSS with the map (they stay in the page cache, shared). A view of the
        map whose rows start at every byte takes each row at its offset in one gather.
        A query's few candidates are read with a ``pread`` a row: a map's page faults
        cost more than the calls there (200 rows: 0.5 ms against 1.9; BENCHMARKS.md,
        "issue 46: codes in the rows' principal directions")."""
        import mmap

        import numpy as np
        from numpy.lib.stride_tricks import as_strided

        dim = self.shape[1]
        out = np.empty((len(positions), dim), np.uint8)
        shard = np.searchsorted(self.offsets, positions, side="right") - 1
        for s in np.unique(shard).tolist():
            mine = np.flatnonzero(shard == s)
            file = self.files[s]
            at = file.byte_offsets(positions[mine] - self.offsets[s], dim)
            if len(mine) <= PREAD_ROWS:
                _pread_rows(file.path, at, out, mine)
            else:
                with open(file.path, "rb") as handle, \
                        mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    flat = np.frombuffer(mapped, np.uint8)
                    if len(at) and int(at.max()) + dim > len(flat):
                        raise ValueError(f"{file.path}: shorter than its rows' offsets")
                    by_byte = as_strided(flat, (max(0, len(flat) - dim + 1), dim), (1, 1),
                                         writeable=False)
                    out[mine] = by_byte[at]
                    del flat, by_byte  # the map closes only once no array points into it
            if file.bias:
                out[mine] -= np.uint8(file.bias)  # index q + 127 -> q, mod 256
        return out.view(self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop``."""
        import numpy as np

        stop = min(stop, len(self))
        return self.read_rows(np.arange(start, max(start, stop), dtype=np.int64))


def _pread_rows(path: str, at: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
    """``out[rows[i]] = `` the ``out.shape[1]`` bytes of ``path`` at ``at[i]``."""
    import os

    width = out.shape[1]
    handle = os.open(path, os.O_RDONLY)
    try:
        for row, offset in zip(rows.tolist(), at.tolist(), strict=True):
            if os.preadv(handle, [out[row]], offset) != width:
                raise ValueError(f"{path}: shorter than its rows' offsets")
    finally:
        os.close(handle)


class ShardRows:
    """The shards' ``rows.arrow`` files, mapped: the columns of rows by position."""

    def __init__(self, paths: Sequence[str], offsets: np.ndarray) -> None:
        import numpy as np
        import pyarrow as pa

        self.tables = [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in paths]
        self.offsets = offsets
        self.column_names = self.tables[0].column_names if self.tables else []
        # Each table's batches and the first row of each: a result's rows are taken from
        # the batches that hold them. ``Table.take`` over a file's dictionary-coded
        # batches cost time in the file's rows (unifying each batch's dictionary): 4 of
        # 9 ms of an any-word search at 2.1M rows (BENCHMARKS.md, issue 46).
        self.batches = [t.to_batches() for t in self.tables]
        self.batch_starts = [np.cumsum([0, *(len(b) for b in bs)]) for bs in self.batches]

    def take(self, columns: Sequence[str], positions: np.ndarray) -> pa.Table:
        """``columns`` of the rows at ``positions``, in their order."""
        import numpy as np
        import pyarrow as pa

        positions = np.asarray(positions, np.int64)
        shard = np.searchsorted(self.offsets, positions, side="right") - 1
        pieces, order = [], []
        for s in np.unique(shard):
            mine = np.flatnonzero(shard == s)
            local = positions[mine] - self.offsets[s]
            batch = np.searchsorted(self.batch_starts[s], local, side="right") - 1
            for b in np.unique(batch):
                here = batch == b
                rows = pa.Table.from_batches([self.batches[s][b].select(list(columns))])
                pieces.append(rows.take(pa.array(local[here] - self.batch_starts[s][b])))
                order.append(mine[here])
        if not pieces:
            first = self.tables[0].select(list(columns)) if self.tables else pa.table({})
            return _decoded(first.slice(0, 0))
        taken = pa.concat_tables([_decoded(p) for p in pieces]).combine_chunks()
        back = np.empty(len(positions), np.int64)
        back[np.concatenate(order)] = np.arange(len(positions))
        return taken.take(pa.array(back))

    def row_column(self, s: int) -> np.ndarray:
        return self.tables[s].column("row").to_numpy()

    def positions_in(self, column: str, values: Sequence[str]) -> np.ndarray:
        """Positions, ascending, of the rows whose ``column`` is one of ``values``: a word
        filter answered from the mapped rows, without LanceDB."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = pa.array(list(values), pa.string())
        found = [np.flatnonzero(pc.is_in(t.column(column), value_set=wanted)
                                .to_numpy()) + self.offsets[s]
                 for s, t in enumerate(self.tables)]
        return np.concatenate(found) if found else np.empty(0, np.int64)


def _decoded(rows: pa.Table) -> pa.Table:
    """``rows`` with dictionary-coded columns as their values (a result's few rows)."""
    import pyarrow as pa

    for i, field in enumerate(rows.schema):
        if pa.types.is_dictionary(field.type):
            rows = rows.set_column(i, field.name, rows.column(i).cast(field.type.value_type))
    return rows
