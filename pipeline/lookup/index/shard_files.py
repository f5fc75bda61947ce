"""A compact index's shard files read by position: the int8 vectors a query's re-rank
reads row by row (``ShardVectors``) and the mapped ``rows.arrow`` columns a result takes
(``ShardRows``); ``ivf_shards`` describes the files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

SHARD_VECTOR_DTYPE = "int8"


class ShardVectors:
    """The vectors of every shard as one ``[n, dim]`` array by position, read with plain
    reads: through the maps, the kernel mapped each touched page's whole folio (264 rows
    added 440 MB to a CLI search's RSS at 2.1M rows; BENCHMARKS.md)."""

    def __init__(self, paths: Sequence[str], rows: Sequence[int], dim: int) -> None:
        import numpy as np

        self.paths = list(paths)
        self.offsets = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self.maps = [np.load(p, mmap_mode="r") for p in self.paths]
        for path, mapped, n in zip(self.paths, self.maps, rows, strict=True):
            if mapped.shape != (n, dim):
                raise ValueError(f"{path}: {mapped.shape}, expected {(n, dim)}")
        self.dtype = self.maps[0].dtype if self.maps else np.dtype(SHARD_VECTOR_DTYPE)
        self.shape = (int(self.offsets[-1]), dim)

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
        """The rows at ``positions`` (ascending), gathered through a map of each shard's
        file made for this call and unmapped after it: as fast as a standing map (a
        ``pread`` a row cost 3x), and the pages it touched leave the process's RSS with
        the map (they stay in the page cache, shared)."""
        import mmap

        import numpy as np

        out = np.empty((len(positions), self.shape[1]), self.dtype)
        shard = np.searchsorted(self.offsets, positions, side="right") - 1
        for s in np.unique(shard).tolist():
            mine = np.flatnonzero(shard == s)
            rows = int(self.offsets[s + 1] - self.offsets[s])
            with open(self.paths[s], "rb") as handle, \
                    mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                stored = np.frombuffer(mapped, self.dtype, rows * self.shape[1],
                                       self.maps[s].offset).reshape(rows, self.shape[1])
                out[mine] = stored[positions[mine] - self.offsets[s]]
                del stored  # the map closes only once no array points into it
        return out

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` read from the files (not through the maps)."""
        import numpy as np

        stop = min(stop, len(self))
        out = np.empty((max(0, stop - start), self.shape[1]), self.dtype)
        row_bytes = self.shape[1] * self.dtype.itemsize
        done = 0
        while start + done < stop:
            at = start + done
            s = int(np.searchsorted(self.offsets, at, side="right") - 1)
            local = at - int(self.offsets[s])
            take = min(stop, int(self.offsets[s + 1])) - at
            offset = self.maps[s].offset  # the .npy header's bytes
            with open(self.paths[s], "rb") as handle:
                handle.seek(offset + local * row_bytes)
                out[done:done + take] = np.fromfile(handle, self.dtype, take * self.shape[1]
                                                    ).reshape(take, self.shape[1])
            done += take
        return out


class ShardRows:
    """The shards' ``rows.arrow`` files, mapped: the columns of rows by position."""

    def __init__(self, paths: Sequence[str], offsets: np.ndarray) -> None:
        import pyarrow as pa

        self.tables = [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in paths]
        self.offsets = offsets
        self.column_names = self.tables[0].column_names if self.tables else []

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
            pieces.append(self.tables[s].select(list(columns)).take(pa.array(local)))
            order.append(mine)
        if not pieces:
            first = self.tables[0].select(list(columns)) if self.tables else pa.table({})
            return first.slice(0, 0)
        taken = pa.concat_tables(pieces).combine_chunks()
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
