"""A compact index's IVF searched by Ray actors that each hold some of its shards.

    elmo senses search "He plays the guitar" --word plays --index s3://b/ix.lance \\
        --ray-address auto --ray-actors 8

``scatter(index, address, actors)`` starts ``actors`` ``ShardSearcher`` actors (default: one
per alive node with a CPU), spread over the cluster's nodes, and gives each a share of the
index's shards (``split_shards``: balanced by rows). Each opens only its shards with
``ShardedIvf`` (codes, sketches and mapped vectors; an object store's files are copied to
that node's disk first), so a node holds ``MEMORY_BYTES_PER_ROW`` bytes for each of its
rows, not the whole index's. The process that asked (``RayIvf``) answers the index's
search calls: a filter's LanceDB keys go to every actor, which turns those of its shards
into positions; a query goes to every actor with the positions that passed, each ranks
its own rows' candidates exactly, and the process keeps the best ``k`` of the answers by
(cosine, position), the order one process breaks ties in.

``elmo serve --shard-actors`` starts the same actors once (``start_searchers``) and hands
their ``RayIvf`` to each Ray Serve replica, whose index then searches through them; a
word's occurrences take their vectors from the actors too (``RayVectors``).

Exact searches (``--exact``, or a filter leaving at most ``EXACT_FILTER_ROWS`` rows: the
default word filter of ``senses search``) rank the same rows as one process, so the hits are
the same. Through the lists, each actor takes its own best candidates from the probed lists
and the sketches: their union holds one process's candidates (up to ties at the cut), so the
gathered hits are one process's, or nearer ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.index.ivf_search import (
    CANDIDATES_PER_RESULT,
    EXACT_FILTER_ROWS,
    sketches_needed,
)
from pipeline.lookup.index.ivf_shards import ShardedIvf, candidates_of, is_sharded
from pipeline.lookup.ray_work import connect

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from pipeline.lookup.index.sense_index import SenseIndex

ACTOR_CPUS = 1.0
START_TIMEOUT_S = 120  # actors open their shards' small files: seconds, whatever the rows
POSITION, SIMILARITY, QUERY = "_elmo_position", "_elmo_similarity", "_elmo_query"


def split_shards(rows: Sequence[int], parts: int) -> list[list[int]]:
    """Shard indexes for each of ``parts`` actors, each holding about as many rows (the
    largest shards first, each to the part with the fewest rows); ascending in a part."""
    if parts < 1:
        raise SettingError("ray_actors", lambda name: (
            f"{name('ray_actors')} must be at least 1, not {parts}"))
    held = [0] * min(parts, max(1, len(rows)))
    split: list[list[int]] = [[] for _ in held]
    for s in sorted(range(len(rows)), key=lambda i: (-rows[i], i)):
        least = held.index(min(held))
        split[least].append(s)
        held[least] += rows[s]
    return [sorted(part) for part in split if part]


class ShardSearcher:
    """One actor's share of a compact index's shards (``shards``: their indexes in
    ``record["shards"]``), opened as a ``ShardedIvf``; positions in and out are the whole
    index's."""

    def __init__(self, uri: str, storage_options: dict | None, record: dict[str, Any],
                 shards: Sequence[int], rebuild: str) -> None:
        import numpy as np

        from schemas.dataset import open_fs

        items = list(record["shards"].items())
        mine = dict(record, shards={items[i][0]: items[i][1] for i in shards})
        fs, root = open_fs(uri, storage_options)
        # A user error (a missing shard) goes back to the caller as its one line.
        self.error: str | None = None
        try:
            self.ivf = ShardedIvf.load(fs, root, mine, rebuild)
        except ElmoUserError as error:
            self.error = str(error)
            return
        every = np.concatenate([[0], np.cumsum([int(s["rows"]) for _, s in items])])
        self.starts = every[list(shards)].astype(np.int64)  # their first whole-index positions
        self.local = self.ivf.offsets.astype(np.int64)

    def ready(self) -> tuple[str, list[str] | str]:
        """The node it runs on and the rows' columns, or the error that stopped it (the
        caller waits on this)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return node, self.error if self.error is not None else list(self.ivf.rows.column_names)

    def to_whole(self, local: np.ndarray) -> np.ndarray:
        import numpy as np

        s = np.searchsorted(self.local, local, side="right") - 1
        return self.starts[s] + local - self.local[s]

    def to_local(self, whole: np.ndarray) -> np.ndarray:
        """Local positions of the whole-index positions ``whole`` in this actor's shards
        (the others are left out)."""
        import numpy as np

        whole = np.asarray(whole, np.int64)
        out = []
        for s, start in enumerate(self.starts):
            size = self.local[s + 1] - self.local[s]
            mine = whole[(whole >= start) & (whole < start + size)]
            out.append(mine - start + self.local[s])
        return np.sort(np.concatenate(out)) if out else np.empty(0, np.int64)

    def positions_of_keys(self, keys: pa.Table) -> np.ndarray:
        """Whole-index positions of the ``keys`` rows that are in this actor's shards."""
        import numpy as np
        import pyarrow as pa

        mine = keys.filter(pa.array(self.ivf.held_mask(keys)))
        if mine.num_rows == 0:
            return np.empty(0, np.int64)
        return self.to_whole(self.ivf.positions_of_keys(mine))

    def nearest(self, queries: np.ndarray, k: int, among: np.ndarray | None,
                columns: Sequence[str]) -> pa.Table:
        """An exact search of this actor's rows (``among``: those of them only): the
        ``columns`` of its ``k`` nearest to each query (``_answer``)."""
        import numpy as np

        local = None if among is None else self.to_local(among)
        if (local is not None and len(local) == 0) or self.local[-1] == 0:
            found = np.full((len(queries), k), -1, np.int64)
            sims = np.full((len(queries), k), -np.inf, np.float32)
        else:
            found, sims = self.ivf.exact(queries, k, local)
        keep = found >= 0
        which = np.broadcast_to(np.arange(len(found))[:, None], found.shape)
        return self._answer(columns, found[keep], sims[keep], which[keep])

    def candidates(self, unit: np.ndarray, want: int, sketched: int, nprobe: int,
                   among: np.ndarray | None) -> list[tuple[np.ndarray, ...]]:
        """Per unit query: this actor's ``want`` nearest rows in the ``nprobe`` nearest
        lists (approximate cosines, positions) and ``sketched`` nearest sketches (bits, positions),
        positions the whole index's; ``among``: only those rows. The caller keeps the best
        of every actor's (``_best``), ties to the lower position as faiss keeps them."""
        import faiss
        import numpy as np

        from pipeline.lookup.index.ivf_search import _Selector

        local = None if among is None else self.to_local(among)
        out = []
        if (local is not None and len(local) == 0) or self.local[-1] == 0:
            empty = (np.empty(0, np.float32), np.empty(0, np.int64))
            return [(*empty, *empty)] * len(unit)
        selector = None if local is None else _Selector(local, self.ivf.index.ntotal)
        sel = None if selector is None else selector.faiss
        rows = self.ivf.index.ntotal if selector is None else selector.rows
        for i in range(len(unit)):
            params = faiss.SearchParametersIVF(nprobe=nprobe, sel=sel)
            far, found = self.ivf.index.search(unit[i:i + 1], min(want, rows), params=params)
            scan = faiss.SearchParameters(sel=sel) if sel is not None else None
            if sketched:
                bits, near = self.ivf.sketch.scan.search(
                    self.ivf.sketch.encode(unit[i:i + 1], self.ivf.sketch.planes,
                                           self.ivf.sketch.mean),
                    min(sketched, rows), params=scan)
            else:  # the build left the sketches out (``sketches_needed``)
                bits, near = np.empty((1, 0), np.int32), np.empty((1, 0), np.int64)
            out.append(tuple(x for f, d in ((found[0], far[0]), (near[0], bits[0]))
                             for x in (d[f >= 0], self.to_whole(f[f >= 0]))))
        return out

    def rank(self, unit: np.ndarray, positions: Sequence[np.ndarray],
             columns: Sequence[str]) -> pa.Table:
        """The exact cosine of each query's candidates held here (``positions``: the whole
        index's, ascending, per query), with their ``columns`` (``_answer``)."""
        import numpy as np

        found, sims, which = [], [], []
        for i, wanted in enumerate(positions):
            local = self.to_local(wanted)
            found.append(local)
            sims.append(self.ivf.cosines(unit[i], local).astype(np.float32))
            which.append(np.full(len(local), i, np.int64))
        return self._answer(columns, *(np.concatenate(x) for x in (found, sims, which)))

    def vectors_at(self, whole: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of the whole-index positions ``whole`` this actor holds (a mask), and
        their vectors in that order (``RayVectors``)."""
        import numpy as np

        whole = np.asarray(whole, np.int64)
        s = np.maximum(np.searchsorted(self.starts, whole, side="right") - 1, 0)
        offset = whole - self.starts[s]
        held = (offset >= 0) & (offset < np.diff(self.local)[s])
        return held, self.ivf.vectors[self.local[s[held]] + offset[held]]

    def _answer(self, columns: Sequence[str], local: np.ndarray, sims: np.ndarray,
                which: np.ndarray) -> pa.Table:
        """``columns`` of the rows at ``local`` positions, with their whole-index position,
        cosine and query (``POSITION``, ``SIMILARITY``, ``QUERY``)."""
        import numpy as np
        import pyarrow as pa

        taken = self.ivf.take_rows(columns, local.astype(np.int64))
        return taken.append_column(POSITION, pa.array(self.to_whole(local.astype(np.int64)))) \
            .append_column(SIMILARITY, pa.array(sims.astype(np.float32))) \
            .append_column(QUERY, pa.array(which.astype(np.int32)))


class RayIvf:
    """The search calls ``SenseIndex`` makes of a compact index's IVF, answered by
    ``ShardSearcher`` actors (``scatter``)."""

    def __init__(self, actors: Sequence[Any], columns: Sequence[str],
                 record: dict[str, Any], nodes: Sequence[str]) -> None:
        self.actors, self.column_names = list(actors), list(columns)
        self.dim, self.rows = int(record["dim"]), int(record["rows"])
        self.nprobe, self.lists = int(record["nprobe"]), int(record["lists"])
        self.candidates = candidates_of(record)
        self.scan_sketches = sketches_needed(record)
        self.nodes = list(nodes)  # the node of each actor

    def holds(self, columns: Sequence[str]) -> bool:
        return set(columns) <= set(self.column_names)

    def positions_of_keys(self, keys: pa.Table) -> np.ndarray:
        import numpy as np
        import ray

        found = ray.get([a.positions_of_keys.remote(keys) for a in self.actors])
        return np.sort(np.concatenate(found))

    def nearest_rows(self, queries: np.ndarray, k: int, columns: Sequence[str],
                     among: np.ndarray | None = None, exact: bool = False) -> pa.Table:
        """``MemoryIvf.nearest_rows``, scattered to the actors and gathered: an exact search
        in one round, a search through the lists and sketches in two (every actor's
        candidates, then the exact cosines of the best of them: one process's)."""
        import numpy as np
        import pyarrow as pa
        import ray

        from pipeline.lookup.index.lance_search import DISTANCE_COLUMN
        from pipeline.lookup.layers.vectors import unit_vectors

        among = None if among is None else np.asarray(among, np.int64)
        among_ref = None if among is None else ray.put(among)
        if exact or (among is not None and len(among) <= EXACT_FILTER_ROWS):
            answers = ray.get([a.nearest.remote(queries, k, among_ref, list(columns))
                               for a in self.actors])
        else:
            unit = unit_vectors(queries)
            wanted = self._candidates(unit, k, len(among) if among is not None else self.rows,
                                      among_ref)
            answers = ray.get([a.rank.remote(unit, wanted, list(columns)) for a in self.actors])
        every = pa.concat_tables(answers).combine_chunks()
        query = every.column(QUERY).to_numpy()
        sims = every.column(SIMILARITY).to_numpy()
        position = every.column(POSITION).to_numpy()
        # Best first, ties to the lower position: one process's order.
        order = np.lexsort((position, -sims, query))
        starts = np.searchsorted(query[order], query[order], side="left")
        order = order[np.arange(len(order)) - starts < k]  # each query's first k
        best = every.take(pa.array(order))
        taken = best.select(list(columns)).append_column(
            DISTANCE_COLUMN, pa.array((1.0 - best.column(SIMILARITY).to_numpy())
                                      .astype(np.float32)))
        if len(queries) > 1:
            taken = taken.append_column("query_index", best.column(QUERY))
        return taken

    def _candidates(self, unit: np.ndarray, k: int, rows: int, among: Any
                    ) -> list[np.ndarray]:
        """Each query's candidates, as ``MemoryIvf._search_one`` takes them from the whole
        index: the ``want`` best of the probed lists (more lists while they hold fewer
        than ``k`` rows) and the ``sketched`` nearest sketches, kept from every actor's."""
        import numpy as np
        import ray

        want = min(rows, max(k, self.candidates * k))
        sketched = min(rows, max(k, CANDIDATES_PER_RESULT * k)) if self.scan_sketches else 0
        chosen: dict[int, np.ndarray] = {}
        pending, nprobe = np.arange(len(unit)), self.nprobe
        while len(pending):
            parts = ray.get([a.candidates.remote(unit[pending], want, sketched, nprobe, among)
                             for a in self.actors])
            widen = []
            for j, q in enumerate(pending):
                lists = _best([p[j][:2] for p in parts], want, larger=True)  # cosines
                if len(lists) < min(rows, k) and nprobe < self.lists:
                    widen.append(q)
                    continue
                chosen[int(q)] = np.unique(np.concatenate(
                    [lists, _best([p[j][2:] for p in parts], sketched)]))
            pending, nprobe = np.asarray(widen, np.int64), min(self.lists, 4 * nprobe)
        return [chosen[i] for i in range(len(unit))]

    def close(self) -> None:
        """End the actors (their CPUs go back to the cluster)."""
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    @property
    def vectors(self) -> RayVectors:
        """The rows' vectors by position, read by the actors that hold them: what a word's
        occurrences (the server's exact search, a sense map) take."""
        return RayVectors(self.actors, self.rows, self.dim)


class RayVectors:
    """``ShardedIvf.vectors`` of an index held by ``ShardSearcher`` actors: indexing by
    whole-index positions asks every actor for the ones it holds."""

    def __init__(self, actors: Sequence[Any], rows: int, dim: int) -> None:
        self.actors, self.shape = list(actors), (rows, dim)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, where: Any) -> np.ndarray:
        import numpy as np
        import ray

        positions = np.asarray(where, np.int64).reshape(-1)
        wanted = ray.put(positions)
        parts = ray.get([a.vectors_at.remote(wanted) for a in self.actors])
        out = np.empty((len(positions), self.shape[1]), parts[0][1].dtype)
        found = np.zeros(len(positions), bool)
        for held, vectors in parts:
            out[held] = vectors
            found |= held
        if not found.all():
            raise ElmoUserError(f"index position {int(positions[~found][0])} is in no "
                                f"actor's shards (of {len(self)} rows)")
        return out


def scatter(index: SenseIndex, address: str, actors: int | None = None) -> RayIvf:
    """Search ``index`` (a compact index in shards) with ``actors`` Ray actors on the
    cluster at ``address`` (``local``: a Ray started here; ``auto``: the running one),
    one per alive node with a CPU by default; the index answers through them from now on."""
    ivf = start_searchers(index, address, actors)
    index.search_with(ivf)
    return ivf


def start_searchers(index: SenseIndex, address: str, actors: int | None = None) -> RayIvf:
    """``scatter``'s actors, started and ready, without giving them to ``index``: the
    returned ``RayIvf`` may be sent to other processes (``elmo serve``'s Ray Serve
    replicas), each giving it to its own ``SenseIndex`` of the same index
    (``search_with``); only the process that started them ends them (``close``)."""
    import ray

    if actors is not None and actors < 1:
        raise SettingError("ray_actors", lambda name: (
            f"{name('ray_actors')} must be at least 1, not {actors}"))
    record = index.meta.ivf
    rebuild = index.build_command()
    if not index.meta.compact or not is_sharded(record):
        raise ElmoUserError(f"{index.uri} is not a compact index in shards, which Ray "
                            f"actors search; {rebuild} makes one (add --rebuild for a "
                            "--full index)")
    connect(address)
    if actors is None:
        actors = max(1, sum(1 for n in ray.nodes()
                            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0))
    rows = [int(s["rows"]) for s in record["shards"].values()]
    remote = ray.remote(num_cpus=ACTOR_CPUS, scheduling_strategy="SPREAD")(ShardSearcher)
    started = [remote.remote(index.uri, index.storage_options, record, part, rebuild)
               for part in split_shards(rows, actors)]
    try:
        ready = ray.get([a.ready.remote() for a in started], timeout=START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        for actor in started:
            ray.kill(actor)
        free = ray.available_resources().get("CPU", 0)
        raise ElmoUserError(f"{len(started)} Ray actors of {ACTOR_CPUS:g} CPU did not start "
                            f"within {START_TIMEOUT_S} s ({free:g} CPUs free on the "
                            "cluster); pass fewer --ray-actors, or add nodes") from None
    for _, columns in ready:
        if isinstance(columns, str):
            for actor in started:
                ray.kill(actor)
            raise ElmoUserError(columns)
    return RayIvf(started, ready[0][1], record, [node for node, _ in ready])


def _best(parts: Sequence[Sequence[np.ndarray]], n: int, larger: bool = False
          ) -> np.ndarray:
    """The positions of the ``n`` best of ``parts`` (scores, positions): the smallest
    scores (``larger``: the largest), ties to the lower position."""
    import numpy as np

    score = np.concatenate([p[0] for p in parts]).astype(np.float64)
    found = np.concatenate([p[1] for p in parts])
    return found[np.lexsort((found, -score if larger else score))[:n]]
