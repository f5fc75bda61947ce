"""Which words are used differently across groups of documents: every word of an index
ranked by change across the groups of a document field, in one pass over its vectors.

    ranking = word_changes("data/sotu-top.lance", by="year", bin=25, top=20)
    ranking = word_changes(ix, by="president", words=["union", "state"])

A word counts in a group with at least ``min_uses`` uses there, and is ranked when it
counts in at least two groups. Uses are distinct contexts (``senses.contexts``): a
sentence repeated in many documents of a group counts once there. Words whose change is
significant (BH q at most ``max_q``) come first, by ``change``; the rest follow, flagged.
Words are the
index's word forms, as search matches them (its Snowball stems: *plays*, *played* and
*playing* are one word, shown by its most frequent form); an index built without stems
groups by the lowercase word.

How it reads: a first pass reads the index's small columns (word, document key, row id)
to count uses per word and group and to choose which uses each score needs; a second
reads the vectors of those uses once (LanceDB batches, or a compact index's in-memory
vectors) and sums them per word and block of documents (``senses.change_scores`` says what
a block is and how the sums become scores, null distributions and intervals). Memory is
one ``dim``-vector per word and block plus ``sense_sample(groups)`` sampled vectors per word
and group, whatever the corpus size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.index.sense_index import SenseIndex
from pipeline.lookup.index.words import column_words, token_filter
from pipeline.lookup.layers.vectors import unit_vectors
from pipeline.lookup.senses.change_scores import (
    DEFAULT_METHOD,
    DEFAULT_MIN_USES,
    DEFAULT_SCORE,
    METHODS,
    SCORES,
    Blocks,
    score_word,
    sense_counts,
    sense_sample,
)
from pipeline.lookup.senses.change_significance import DEFAULT_MAX_Q, bh_qvalues, max_shuffles
from pipeline.lookup.senses.clusters import WORD_RE
from pipeline.lookup.senses.contexts import distinct_rows, index_texts, main_forms
from pipeline.lookup.senses.groups import DocumentGroups, document_groups

if TYPE_CHECKING:
    import pyarrow as pa

# Each group's documents are dealt into this many blocks (fewer when it has fewer
# documents): the units the null and the bootstrap resample.
DEFAULT_BLOCKS = 16
DEFAULT_RESAMPLES = 200
# The vector pass filters on the words themselves up to this many (a longer IN list costs
# LanceDB more than reading the other words' rows and leaving them).
MAX_FILTER_WORDS = 2_000
READ_BATCH_ROWS = 1 << 16


@dataclass
class WordChange:
    word: str  # the word's most frequent form (lowercase)
    change: float  # the method's score against its shuffled-groups null (SCORES)
    method: str
    scores: dict[str, float]  # method -> raw score
    z: dict[str, float]  # method -> standardised score
    p: float  # the method's permutation p-value (``shuffles`` of them)
    null_mean: float  # the method's mean score with shuffled groups
    interval: tuple[float, float]  # the method's raw score, bootstrap interval
    uses: dict[str, int]  # group -> distinct contexts (the groups it counts in)
    documents: int = 0  # documents using it, in those groups
    rank: int = 0
    null_means: dict[str, float] = field(default_factory=dict)  # every method's
    q: float = math.nan  # Benjamini-Hochberg adjusted p across the words ranked
    significant: bool = False  # q <= the ranking's max_q
    shuffles: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: ``word`` and ``change`` first."""
        def num(v: float) -> float | None:
            return None if v is None or not math.isfinite(v) else round(float(v), 6)

        return {"word": self.word, "change": num(self.change), "rank": self.rank,
                "method": self.method, "p": num(self.p), "q": num(self.q),
                "significant": self.significant, "shuffles": self.shuffles,
                **{m: num(self.scores[m]) for m in METHODS},
                **{f"{m}_z": num(self.z[m]) for m in METHODS},
                **{f"{m}_excess": num(self.scores[m] - self.null_means.get(m, math.nan))
                   for m in METHODS},
                "null_mean": num(self.null_mean),
                "interval": [num(self.interval[0]), num(self.interval[1])],
                "uses": dict(self.uses), "documents": self.documents}


@dataclass
class ChangeRanking:
    by: str
    bin: float | None
    method: str
    groups: list[str]  # every group of the field, in order
    min_uses: int
    rows: list[WordChange] = field(default_factory=list)  # highest change first
    candidates: int = 0  # words counting in two groups or more (all ranked)
    mix: str = ""
    blocks: int = DEFAULT_BLOCKS
    resamples: int = DEFAULT_RESAMPLES
    left_out_docs: int = 0  # documents without the field
    score: str = DEFAULT_SCORE  # what ``change`` is (SCORES)
    max_q: float = DEFAULT_MAX_Q  # significance level of q
    significant: int = 0  # words ranked with q <= max_q (before ``top``)
    repeats: int = 0  # uses left out as repeats of a context already counted

    def table(self) -> pa.Table:
        """The rows as an Arrow table (``--out``): scores, intervals, uses per group."""
        import pyarrow as pa

        rows = [r.to_dict() for r in self.rows]
        uses_type = pa.list_(pa.struct([("group", pa.string()), ("uses", pa.int64())]))
        columns: dict[str, pa.Array] = {
            "rank": pa.array([r["rank"] for r in rows], pa.int32()),
            "word": pa.array([r["word"] for r in rows], pa.string()),
            "change": pa.array([r["change"] for r in rows], pa.float64()),
            "method": pa.array([r["method"] for r in rows], pa.string()),
            "p": pa.array([r["p"] for r in rows], pa.float64()),
            "q": pa.array([r["q"] for r in rows], pa.float64()),
            "significant": pa.array([r["significant"] for r in rows], pa.bool_()),
            "shuffles": pa.array([r["shuffles"] for r in rows], pa.int64())}
        for name in (*METHODS, *(f"{m}_z" for m in METHODS),
                     *(f"{m}_excess" for m in METHODS), "null_mean"):
            columns[name] = pa.array([r[name] for r in rows], pa.float64())
        columns["interval_low"] = pa.array([r["interval"][0] for r in rows], pa.float64())
        columns["interval_high"] = pa.array([r["interval"][1] for r in rows], pa.float64())
        # Uses are distinct contexts (module docstring).
        columns["uses"] = pa.array([sum(r["uses"].values()) for r in rows], pa.int64())
        columns["documents"] = pa.array([r["documents"] for r in rows], pa.int64())
        columns["uses_by_group"] = pa.array(
            [[{"group": g, "uses": n} for g, n in r["uses"].items()] for r in rows], uses_type)
        return pa.table(columns)


def _check_arguments(method: str, min_uses: int, top: int | None, blocks: int,
                     resamples: int, words: Sequence[str] | None) -> None:
    if method not in METHODS:
        raise SettingError("method", lambda name: (
            f"{name('method')} must be one of {', '.join(METHODS)}, not {method!r}"))
    if min_uses < 2:
        raise SettingError("min_uses", lambda name: (
            f"{name('min_uses')} must be at least 2, not {min_uses}"))
    if top is not None and top < 1:
        raise SettingError("top", lambda name: f"{name('top')} must be at least 1, not {top}")
    if blocks < 2 or resamples < 10:
        raise ElmoUserError("blocks must be at least 2 and resamples at least 10")
    if words is not None and not [w for w in words if w.strip()]:
        raise SettingError("words", lambda name: (
            f"{name('words')} names no word; pass e.g. {name('words')} union,state"))


def word_changes(index: str | SenseIndex, by: str, bin: float | None = None, *,
                 words: Sequence[str] | None = None, top: int | None = None,
                 min_uses: int = DEFAULT_MIN_USES, method: str = DEFAULT_METHOD,
                 score: str = DEFAULT_SCORE, max_q: float = DEFAULT_MAX_Q,
                 blocks: int = DEFAULT_BLOCKS, resamples: int = DEFAULT_RESAMPLES,
                 seed: int = 0, progress: bool = False) -> ChangeRanking:
    """Words ranked by how differently they are used across the groups of document field
    ``by`` (numbers in bins of ``bin``): all words counting in two groups, or ``words``
    (each must); significant ones (q <= ``max_q``) first; ``top`` keeps the first rows.
    See the module's docstring."""
    _check_arguments(method, min_uses, top, blocks, resamples, words)
    if not 0 < max_q <= 1:
        raise SettingError("max_q", lambda name: (
            f"{name('max_q')} is a false discovery rate between 0 and 1, not {max_q:g}"))
    if score not in SCORES:
        raise SettingError("score", lambda name: (
            f"{name('score')} must be one of {', '.join(SCORES)}, not {score!r}"))
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    column = "token_stem"
    wanted = [w.strip() for w in words if w.strip()] if words is not None else None
    if wanted:
        ix.require_indexed(wanted, column)
    rng = np.random.default_rng(seed)
    keys = _read_keys(ix, column, token_filter(wanted, column) if wanted else None)
    if keys.num_rows == 0 and wanted:
        raise SettingError("words", lambda name: (
            f"{' / '.join(map(repr, wanted))} has no uses in this index; check the "
            f"spelling, or pass other {name('words')}"))
    if keys.num_rows == 0:
        raise ElmoUserError(f"{ix.uri} holds no words")
    groups = document_groups(ix, keys, by, bin, blocks, rng)
    distinct = distinct_rows(keys, index_texts(ix), np.where(
        groups.doc_of_rows >= 0, groups.doc_group[np.maximum(groups.doc_of_rows, 0)], -1))
    plan = _plan(keys, column, groups, min_uses, wanted, rng, distinct)
    ranking = ChangeRanking(by, bin, method, groups.labels, min_uses, mix=ix.meta.mix_name,
                            blocks=blocks, resamples=resamples,
                            left_out_docs=groups.left_out_docs, candidates=len(plan.words),
                            score=score, max_q=max_q,
                            repeats=int((~distinct & (groups.doc_of_rows >= 0)).sum()))
    if not plan.words:
        raise SettingError("min_uses", lambda name: (
            f"no word has {min_uses} uses in two groups of {by} "
            f"({len(groups.labels)} groups: {', '.join(groups.labels[:6])}"
            f"{', ...' if len(groups.labels) > 6 else ''}); lower {name('min_uses')}"
            f"{' or widen ' + name('bin') if bin else ''}"))
    sums, samples = _gather(ix, plan, column, progress)
    ranking.rows = _score(plan, groups, sums, samples, method, score,
                          (resamples, max_shuffles(len(plan.words), resamples, max_q)),
                          rng, progress)
    for row, q in zip(ranking.rows, bh_qvalues(np.array([r.p for r in ranking.rows])),
                      strict=True):
        row.q, row.significant = float(q), bool(q <= max_q)
    ranking.significant = sum(r.significant for r in ranking.rows)
    ranking.rows.sort(key=lambda r: (not r.significant,
                                     -r.change if math.isfinite(r.change) else math.inf,
                                     r.word))
    for rank, row in enumerate(ranking.rows, 1):
        row.rank = rank
    if top is not None:
        ranking.rows = ranking.rows[:top]
    return ranking


def _read_keys(ix: SenseIndex, column: str, where: str | None) -> pa.Table:
    """Pass 1: every row's word, lowercase form, document key and row id (no vectors)."""
    # The sentence's key and the token's place in it tell repeated contexts apart.
    context = ["sent_idx", "tok_idx"]
    query = ix.table.search().select([column, "token_lower", "doc_id", "part", "shard",
                                      *context])
    if where is not None:
        query = query.where(where)
    rows = max(1, ix.table.count_rows(where))
    table = query.with_row_id(True).limit(rows).to_arrow()
    return table.rename_columns(["word" if n == column else n for n in table.column_names])


@dataclass
class _Plan:
    """What pass 2 reads and where each use goes."""

    words: list[str]  # candidate words (column values)
    forms: list[str]  # each word's most frequent lowercase form
    qualifying: np.ndarray  # [words, groups] bool: the word counts in the group
    uses: np.ndarray  # [words, groups] uses
    docs: np.ndarray  # [words] documents using the word in its qualifying groups
    rowids: np.ndarray  # sorted row ids of the uses read
    slot: np.ndarray  # per row id: its (word, block) sum's row
    sample: np.ndarray  # per row id: its row in the sample store, -1 if not sampled
    slot_word: np.ndarray  # per sum row: candidate word
    slot_block: np.ndarray  # per sum row: global block
    slot_uses: np.ndarray  # per sum row: uses summed in it
    sample_word: np.ndarray  # per sample row: candidate word
    sample_block: np.ndarray  # per sample row: global block


def _plan(keys: pa.Table, column: str, groups: DocumentGroups, min_uses: int,
          wanted: list[str] | None, rng: np.random.Generator, distinct: np.ndarray) -> _Plan:
    """``distinct``: the rows counted (a repeated context's first use, ``contexts``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    doc = groups.doc_of_rows
    keep = doc >= 0
    encoded = pc.dictionary_encode(keys.column("word")).combine_chunks()
    vocab = encoded.dictionary.to_pylist()
    word = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    n_groups = len(groups.labels)
    group = np.where(keep, groups.doc_group[np.maximum(doc, 0)], -1)
    counted = keep & distinct
    uses = np.bincount(word[counted] * n_groups + group[counted],
                       minlength=len(vocab) * n_groups).reshape(len(vocab), n_groups)
    qualifying = uses >= min_uses
    if wanted:
        _check_wanted(wanted, column, vocab, uses, qualifying, groups.labels, min_uses)
    # Words only: a token without a letter (punctuation, a number) is no word to rank.
    is_word = np.array([WORD_RE.search(v) is not None for v in vocab], bool)
    candidate = (qualifying.sum(1) >= 2) & is_word
    new_id = np.full(len(vocab), -1, np.int64)
    new_id[candidate] = np.arange(int(candidate.sum()))
    row_word = new_id[word]
    use = keep & (row_word >= 0)
    use[use] = qualifying[word[use], group[use]]
    # Documents using the word, repeats included; the uses summed, repeats left out.
    pairs = np.unique(row_word[use] * (len(groups.doc_group) + 1) + doc[use])
    use &= distinct
    rowid = keys.column("_rowid").to_numpy()[use]
    w, g, b = row_word[use], group[use], groups.doc_block[doc[use]]
    n_blocks = groups.n_blocks
    slots, slot = np.unique(w * n_blocks + b, return_inverse=True)
    # sense_sample(groups) uses per (word, group), at random: the first by a random priority.
    pair = w * n_groups + g
    order = np.lexsort((rng.random(len(pair)), pair))
    first = np.r_[0, np.flatnonzero(np.diff(pair[order])) + 1]
    rank = np.arange(len(order)) - np.repeat(first, np.diff(np.r_[first, len(order)]))
    sampled = np.zeros(len(pair), bool)
    sampled[order[rank < sense_sample(n_groups)]] = True
    sample = np.full(len(pair), -1, np.int64)
    sample[sampled] = np.arange(int(sampled.sum()))
    by_rowid = np.argsort(rowid)
    docs = np.zeros(int(candidate.sum()), np.int64)
    np.add.at(docs, pairs // (len(groups.doc_group) + 1), 1)
    forms = main_forms(keys.filter(pa.array(keep & (row_word >= 0))), vocab, candidate)
    return _Plan([vocab[i] for i in np.flatnonzero(candidate)], forms,
                 qualifying[candidate], uses[candidate], docs, rowid[by_rowid],
                 slot[by_rowid], sample[by_rowid], slots // n_blocks, slots % n_blocks,
                 np.bincount(slot, minlength=len(slots)), w[sampled], b[sampled])


def _check_wanted(wanted: list[str], column: str, vocab: list[str], uses: np.ndarray,
                  qualifying: np.ndarray, labels: list[str], min_uses: int) -> None:
    """A named word with too few uses is a user error saying how many it has."""
    position = {v: i for i, v in enumerate(vocab)}
    for word, stored in zip(wanted, column_words(wanted, column), strict=True):
        i = position.get(stored)
        if i is None:
            raise SettingError("words", lambda name, word=word: (
                f"{word!r} has no uses in documents with the field; check the spelling, or "
                f"pass other {name('words')}"))
        if qualifying[i].sum() < 2:
            counts = ", ".join(f"{labels[g]}: {n}" for g, n in enumerate(uses[i]) if n)
            most = sorted(uses[i])[-2] if len(labels) > 1 else 0
            raise SettingError("min_uses", lambda name, word=word, counts=counts, most=most: (
                f"{word!r} has too few uses to compare: it needs {min_uses} in at least two "
                f"groups and has {counts}; pass {name('min_uses')} {max(2, most)} or less, "
                f"or a wider {name('bin')}"))


def _vector_batches(ix: SenseIndex, plan: _Plan, column: str) -> Any:
    """Pass 2: ``(row ids, float32 vectors)`` of (at least) the planned uses."""
    # The columns of a row that find its vector (its own, or the keys of a compact index's).
    backend = ix.backend
    query = ix.table.search().select(list(backend.vector_columns)).with_row_id(True)
    if len(plan.words) <= MAX_FILTER_WORDS:
        query = query.where(token_filter(plan.words, "token_lower") if column == "token_lower"
                            else f"token_stem IN ({', '.join(_quoted(plan.words))})")
    for batch in query.limit(max(1, ix.table.count_rows())).to_batches(
            batch_size=READ_BATCH_ROWS):
        yield batch.column("_rowid").to_numpy(), backend.vectors_of(batch)


def _quoted(words: Sequence[str]) -> list[str]:
    from pipeline.lookup.doc_fields import quote

    return [quote(w) for w in words]


def _gather(ix: SenseIndex, plan: _Plan, column: str, progress: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """Pass 2: sums of unit vectors per (word, block) slot, and the sampled unit vectors."""
    from tqdm import tqdm

    sums = np.zeros((len(plan.slot_word), ix.meta.dim), np.float32)  # each batch adds in float64
    samples = np.zeros((len(plan.sample_word), ix.meta.dim), np.float16)  # unit vectors
    with tqdm(total=len(plan.rowids), unit="use", unit_scale=True, disable=not progress,
              desc="senses change: read vectors", file=_stderr(), delay=1.0) as bar:
        for rowids, vectors in _vector_batches(ix, plan, column):
            at = np.minimum(np.searchsorted(plan.rowids, rowids), len(plan.rowids) - 1)
            found = plan.rowids[at] == rowids
            if not found.any():
                continue
            at, x = at[found], vectors[found]
            x = unit_vectors(x)
            slot = plan.slot[at]
            order = np.argsort(slot, kind="stable")
            starts = np.r_[0, np.flatnonzero(np.diff(slot[order])) + 1]
            sums[slot[order][starts]] += np.add.reduceat(x[order].astype(np.float64), starts)
            sampled = plan.sample[at] >= 0
            samples[plan.sample[at][sampled]] = x[sampled]
            bar.update(len(at))
    return sums, samples


def _stderr() -> Any:
    import sys

    return sys.stderr


def _score(plan: _Plan, groups: DocumentGroups, sums: np.ndarray, samples: np.ndarray,
           method: str, score: str, shuffles: tuple[int, int], rng: np.random.Generator,
           progress: bool) -> list[WordChange]:
    """Each candidate word's blocks (those of its qualifying groups), then its scores;
    ``shuffles``: (for every word, at most for a word whose p is small)."""
    from tqdm import tqdm

    slot_order = np.argsort(plan.slot_word, kind="stable")
    slot_bounds = np.searchsorted(plan.slot_word[slot_order], np.arange(len(plan.words) + 1))
    sample_order = np.argsort(plan.sample_word, kind="stable")
    sample_bounds = np.searchsorted(plan.sample_word[sample_order],
                                    np.arange(len(plan.words) + 1))
    rows = []
    for i in tqdm(range(len(plan.words)), disable=not progress, desc="senses change: score",
                  unit="word", file=_stderr(), delay=1.0):
        group_ids = np.flatnonzero(plan.qualifying[i])
        block_ids = np.concatenate([groups.blocks_of(g) for g in group_ids])
        local = np.full(groups.n_blocks, -1, np.int64)
        local[block_ids] = np.arange(len(block_ids))
        sizes = [len(groups.blocks_of(g)) for g in group_ids]
        mine = slot_order[slot_bounds[i]:slot_bounds[i + 1]]
        block_sums = np.zeros((len(block_ids), sums.shape[1]))
        block_sums[local[plan.slot_block[mine]]] = sums[mine]
        counts = np.zeros(len(block_ids))
        counts[local[plan.slot_block[mine]]] = plan.slot_uses[mine]
        picked = sample_order[sample_bounds[i]:sample_bounds[i + 1]]
        where = local[plan.sample_block[picked]]
        senses = sense_counts(samples[picked].astype(np.float64), where, len(block_ids), rng)
        blocks = Blocks(np.r_[0, np.cumsum(sizes)[:-1]], block_sums, counts, senses)
        s = score_word(blocks, shuffles[0], rng, method, shuffles[1])
        uses = {groups.labels[g]: int(plan.uses[i, g]) for g in group_ids}
        change = s.z[method] if score == "z" else s.raw[method] - s.null_mean[method]
        rows.append(WordChange(plan.forms[i], change, method, s.raw, s.z, s.p[method],
                               s.null_mean[method], s.interval[method], uses,
                               int(plan.docs[i]), null_means=s.null_mean,
                               shuffles=s.shuffles))
    return rows

