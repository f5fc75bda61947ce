"""Concurrent requests share one model call and one LanceDB search.

Requests wait at most ``BATCH_WINDOW_S`` (or until ``MAX_BATCH`` are in) for others,
and only while other HTTP requests are under way (a lone request goes at once); while a
batch runs, new requests queue and form the next one, so under load batches grow by
themselves. One batch
runs at a time on one worker thread: the model and LanceDB already use the cores, and
two batches at once would only make each slower.

In a batch, every sentence (embed requests and sense-search queries alike) goes to one
``embedder.embed`` call, less those whose layers are still kept (``LayerCache``); a search
alone in its batch runs only its token's part of the biLM (``LayerCache.position``). A search
for a word with few rows is answered in this process over its cached rows
(``exact.ExactSearch``, below ``EXACT_CANDIDATE_VALUES``); the others are grouped by what
LanceDB must be told once per call (index, word filter, rows fetched) and each group is
one multi-vector search (``SenseIndex.vector_query``), whose ``query_index`` column splits
the rows back. A query whose rows hold too few distinct contexts (repeated passages, or a
document filter) is searched again further, with the others that came up short: the
answers are those of ``nearest_distinct``, one query at a time.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.lookup.index.sense_index import SenseIndex
from pipeline.lookup.senses.hits import Hit, hits_from_table, ranked_distinct
from pipeline.lookup.senses.search import FETCH_FACTOR, MAX_FETCH, QueryToken, query_vector
from pipeline.lookup.serve.exact import ExactSearch
from pipeline.lookup.serve.limits import (
    BATCH_WINDOW_S,
    LAYER_CACHE_BYTES,
    LAYER_CACHE_SENTENCES,
    MAX_BATCH,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from schemas import DatasetDescriptor


@dataclass
class EmbedJob:
    sentences: list[list[str]]
    future: asyncio.Future[Any] = field(repr=False)


@dataclass
class SearchJob:
    index: SenseIndex
    query: QueryToken
    k: int
    words: tuple[str, ...] | None  # None: every token
    forms: bool
    where: str | None  # document-field prefilter (SenseIndex.fields_where; None: all)
    future: asyncio.Future[Any] = field(repr=False)

    @property
    def sentences(self) -> list[list[str]]:
        return [self.query.tokens]

    def first_fetch(self) -> int:
        return min(MAX_FETCH, max(self.k * FETCH_FACTOR, self.k + 8))


@dataclass
class BatchStats:
    batches: int = 0
    jobs: int = 0
    largest: int = 0


class Batcher:
    def __init__(self, embedder: Any, descriptor: DatasetDescriptor,
                 window_s: float = BATCH_WINDOW_S, max_batch: int = MAX_BATCH) -> None:
        self.embedder, self.descriptor = embedder, descriptor
        self.window_s, self.max_batch = window_s, max_batch
        self.queue: asyncio.Queue[EmbedJob | SearchJob] = asyncio.Queue()
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="elmo-batch")
        self.stats = BatchStats()
        self.requests_in_flight = 0  # HTTP requests being served (the app's middleware counts)
        self.exact = ExactSearch()
        self.layers = LayerCache(embedder)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._gather())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.worker.shutdown(wait=False, cancel_futures=True)

    async def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        """Each sentence's ``[L+1, n, dim]`` layers."""
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(EmbedJob(sentences, future))
        return await future

    async def search(self, index: SenseIndex, query: QueryToken, k: int,
                     words: tuple[str, ...] | None, forms: bool,
                     where: str | None = None) -> list[Hit]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(SearchJob(index, query, k, words, forms, where, future))
        return await future

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + self.window_s
            while len(batch) < self.max_batch:
                if not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0 or self.requests_in_flight <= len(batch):
                    break  # the window is over, or no other request could join
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), left))
                except TimeoutError:
                    break
            outcomes = await loop.run_in_executor(self.worker, self.run_batch, batch)
            for job, (ok, value) in zip(batch, outcomes, strict=True):
                if job.future.done():  # the client went away
                    continue
                if ok:
                    job.future.set_result(value)
                else:
                    job.future.set_exception(value)

    def run_batch(self, jobs: list[EmbedJob | SearchJob]) -> list[tuple[bool, Any]]:
        """``(True, result)`` or ``(False, exception)`` per job, in order."""
        self.stats.batches += 1
        self.stats.jobs += len(jobs)
        self.stats.largest = max(self.stats.largest, len(jobs))
        sentences = [s for job in jobs for s in job.sentences]
        alone = None  # a lone search's token layers: its position's alone (LayerCache.position)
        try:
            if len(jobs) == 1 and isinstance(jobs[0], SearchJob):
                alone, layers = self.layers.position(jobs[0].query), []
            else:
                layers = self.layers.embed(sentences)
        except Exception as error:  # every job of the batch gets it
            return [(False, error)] * len(jobs)
        outcomes: list[tuple[bool, Any]] = [(False, RuntimeError("not run"))] * len(jobs)
        groups: dict[tuple[Any, ...], list[tuple[int, np.ndarray]]] = {}
        mixes: dict[int, Any] = {}  # the index's mix is parsed once per batch
        at = 0
        for i, job in enumerate(jobs):
            mine = layers[at:at + len(job.sentences)]
            at += len(job.sentences)
            if isinstance(job, EmbedJob):
                outcomes[i] = (True, mine)
                continue
            try:
                if id(job.index) not in mixes:
                    mixes[id(job.index)] = job.index.mix
                token_layers = mine[0][:, job.query.position, :] if alone is None else alone
                vector = query_vector(token_layers, mixes[id(job.index)], self.descriptor)
            except Exception as error:
                outcomes[i] = (False, error)
                continue
            # A filtered search goes to the index, whose prefilter knows the fields.
            if (job.words is not None and job.where is None
                    and self.exact.takes(job.index, job.words, job.forms)):
                try:
                    outcomes[i] = (True, self.exact.nearest(job.index, job.words, job.forms,
                                                            vector, job.k))
                except Exception as error:
                    outcomes[i] = (False, error)
                continue
            key = (id(job.index), job.words, job.forms, job.where, job.first_fetch())
            groups.setdefault(key, []).append((i, vector))
        for members in groups.values():
            group_jobs = [jobs[i] for i, _ in members]
            try:
                found = search_group(group_jobs, np.stack([v for _, v in members]))
                for (i, _), hits in zip(members, found, strict=True):
                    outcomes[i] = (True, hits)
            except Exception as error:
                for i, _ in members:
                    outcomes[i] = (False, error)
        return outcomes


class LayerCache:
    """Layers of recently embedded sentences (the embedder is stateless: a sentence's
    layers do not depend on what else was in its batch). Used by the worker thread only.
    Bounded by sentences and by bytes: long distinct sentences (a hostile client's) would
    otherwise keep megabytes each."""

    def __init__(self, embedder: Any, size: int = LAYER_CACHE_SENTENCES,
                 max_bytes: int = LAYER_CACHE_BYTES) -> None:
        self.embedder, self.size, self.max_bytes = embedder, size, max_bytes
        self.kept: OrderedDict[tuple[str, ...], np.ndarray] = OrderedDict()
        # a sentence's one token's layers, [L+1, 2P], by (sentence, position)
        self.positions: OrderedDict[tuple[tuple[str, ...], int], np.ndarray] = OrderedDict()
        self.bytes = 0  # of the arrays kept

    def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        keys = [tuple(s) for s in sentences]
        missing = list(dict.fromkeys(k for k in keys if k not in self.kept))
        if missing:
            for key, layers in zip(missing, self.embedder.embed([list(k) for k in missing]),
                                   strict=True):
                self.kept[key] = layers
                self.bytes += layers.nbytes
        out = []
        for key in keys:
            self.kept.move_to_end(key)
            out.append(self.kept[key])
        self._bound()
        return out

    def position(self, query: QueryToken) -> np.ndarray:
        """The ``[L+1, 2P]`` layers of the query's token. A lone search's new sentence runs
        each direction of the biLM only as far as that token (``position_layers``: the
        same bits, about half the recurrence for a middle word), and only they are kept."""
        key = tuple(query.tokens)
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key][:, query.position]
        token_key = (key, query.position)
        if token_key not in self.positions:
            from elmo_model.embedder import ElmoEmbedder  # torch: the model has loaded it
            from elmo_model.query_position import position_layers

            if not (isinstance(self.embedder, ElmoEmbedder) and self.embedder.mode == "stateless"):
                return self.embed([query.tokens])[0][:, query.position]
            layers = position_layers(self.embedder, query.tokens, query.position)
            self.positions[token_key] = layers
            self.bytes += layers.nbytes
        self.positions.move_to_end(token_key)
        layers = self.positions[token_key]
        self._bound()
        return layers

    def _bound(self) -> None:
        for kept in (self.kept, self.positions):
            while kept and (len(kept) > self.size or self.bytes > self.max_bytes):
                self.bytes -= kept.popitem(last=False)[1].nbytes


def search_group(jobs: list[SearchJob], vectors: np.ndarray) -> list[list[Hit]]:
    """The ``k`` nearest distinct contexts for each job; the jobs share index, words,
    forms, prefilter and first fetch size."""
    first = jobs[0]
    results: list[list[Hit] | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    fetch = first.first_fetch()
    while pending:
        table = first.index.vector_query(vectors[pending], k=fetch, words=first.words,
                                         forms=first.forms, where=first.where).to_arrow()
        still = []
        for j, part in zip(pending, split_by_query(table, len(pending)), strict=True):
            job = jobs[j]
            distinct = ranked_distinct(hits_from_table(part), job.k)
            if len(distinct) < job.k and part.num_rows >= fetch and fetch < MAX_FETCH:
                still.append(j)  # more rows exist: fetch further
                continue
            results[j] = distinct
        pending = still
        fetch = min(MAX_FETCH, fetch * 4)
    return [r or [] for r in results]


def split_by_query(table: pa.Table, n: int) -> list[pa.Table]:
    """The rows of each query of a multi-vector search, nearest first."""
    import pyarrow.compute as pc

    if n == 1:
        return [table.drop_columns(["query_index"]) if "query_index" in table.column_names
                else table]
    index = table.column("query_index")
    return [table.filter(pc.equal(index, q)).sort_by("_distance") for q in range(n)]
