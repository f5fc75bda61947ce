"""Distinct contexts: what every sense view counts, so that a sentence repeated in many
documents (a boilerplate paragraph, a template, a quoted notice) counts once.

The rule, in one place: two uses of a word are the same context when their sentence text
and the token's place in it are the same, the text compared with white space normalised
and identifiers masked (``normalised``: numbers, hashes, versions, paths; so the lines a
bot or a template writes, "Merge pull request #4632 from user/branch", are one context);
of a context's uses the one kept is that of the first document in ``(doc_id, sent_idx)``
order. Where uses are compared across groups of documents (``elmo senses change``: the
ranking and the one-word view, ``elmo senses cluster --by``), a context counts once in
each group it occurs in: a template used in both periods is a use in both, while a
notice repeated in 55 documents of one year counts once there. Without groups (the
sense maps) it counts once. A use whose sentence text is unknown (a dataset that stores
none) is its own context. Everything counts through ``first_of_each`` or
``distinct_rows``.

A word's forms: the ranking compares the index's word forms (Snowball stems: *plays*,
*played*, *playing* are one word); ``word_forms`` gives the lowercase forms that share a
word's stem, so a view of one word counts the same uses the ranking does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

# A word with one of these is an identifier, not language: a number, a hash, a version, a
# path, ``user/branch``, an e-mail address. Generated lines differ in them only ("Merge
# pull request #4632 from user/branch"): masked, such lines are one context.
_IDENTIFIER = re.compile(r"[\d/@]")

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.lookup.index.sense_index import SenseIndex


def normalised(text: str | None) -> str:
    """A sentence's text as contexts compare it (empty if unknown): runs of white space as
    one space, and every word holding a digit, ``/`` or ``@`` masked (``#``)."""
    if not text:
        return ""
    return " ".join("#" if _IDENTIFIER.search(w) else w for w in text.split())


def first_of_each(context: Sequence[Any], doc_ids: Sequence[str], sent_idx: Sequence[int],
                  groups: Sequence[Any] | None = None) -> list[int]:
    """Positions (ascending) of the use kept for each context (in each of ``groups``, one
    per use, if given): the first by ``(doc_id, sent_idx)``."""
    best: dict[Any, tuple[str, int, int]] = {}
    in_group = groups if groups is not None else [None] * len(context)
    for i, (key, doc, sent, group) in enumerate(zip(context, doc_ids, sent_idx, in_group,
                                                     strict=True)):
        mine = (str(doc), int(sent), i)
        if (group, key) not in best or mine < best[group, key]:
            best[group, key] = mine
    return sorted(i for _, _, i in best.values())


def distinct_rows(keys: pa.Table, texts: pa.Table | None, group: np.ndarray) -> np.ndarray:
    """Which rows of ``keys`` (``doc_id``, ``sent_idx``, ``tok_idx``, and ``part``,
    ``shard``, or a ``sentence`` column holding the text) are kept: a bool mask, the rule
    above, once per ``group`` (one per row). ``texts``: the index's sentence rows
    (``doc_id, sent_idx, part, shard, text``) when ``keys`` holds no ``sentence`` column;
    None: every row is its own context."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = keys.num_rows
    if "sentence" in keys.column_names:
        text = keys.column("sentence")
    elif texts is not None and texts.num_rows:
        key_columns = [c for c in ("part", "shard", "doc_id", "sent_idx")
                       if c in texts.column_names and c in keys.column_names]
        numbered = keys.select(key_columns).append_column(
            "_row", pa.array(np.arange(n, dtype=np.int64)))
        joined = numbered.join(texts.select([*key_columns, "text"]), keys=key_columns,
                               join_type="left outer")
        order = joined.column("_row").to_numpy()
        text = pc.take(joined.column("text"), pa.array(np.argsort(order)))
    else:
        return np.ones(n, bool)
    encoded = pc.dictionary_encode(text).combine_chunks()
    normal = [normalised(t) for t in encoded.dictionary.to_pylist()]
    # Identical after normalising -> one text number; unknown text -> -1 (its own context).
    number = {t: i for i, t in enumerate(dict.fromkeys(normal))}
    text_of = np.array([number[t] if t else -1 for t in normal] or [0], np.int64)
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    text_id = np.where(codes >= 0, text_of[np.maximum(codes, 0)], -1)
    tok = keys.column("tok_idx").to_numpy(zero_copy_only=False).astype(np.int64)
    sent = keys.column("sent_idx").to_numpy(zero_copy_only=False).astype(np.int64)
    _, doc_rank = np.unique(
        np.asarray(keys.column("doc_id").to_pylist(), dtype=object).astype(str),
        return_inverse=True)
    order = np.lexsort((np.arange(n), sent, doc_rank, tok, text_id, group))
    t, k, g = text_id[order], tok[order], group[order]
    first = np.r_[True, (t[1:] != t[:-1]) | (k[1:] != k[:-1]) | (g[1:] != g[:-1])]
    keep = np.zeros(n, bool)
    keep[order[first | (t < 0)]] = True
    return keep


def index_texts(ix: SenseIndex) -> pa.Table | None:
    """The index's sentence rows (layout 2), or None when its token rows hold the text."""
    table = ix.sentences
    if table is None:
        return None
    columns = [c for c in ("doc_id", "sent_idx", "part", "shard", "text")
               if c in table.schema.names]
    return table.search().select(columns).limit(max(1, table.count_rows())).to_arrow()


def word_forms(ix: SenseIndex, word: str) -> list[str]:
    """The lowercase forms in the index that share ``word``'s stem (``word`` itself
    first)."""
    from pipeline.lookup.index.words import stem_words, token_filter

    lower = word.lower()
    stem = stem_words([lower])[0]
    counts = ix.word_counts.table()
    if counts is not None and {"token_lower", "token_stem"} <= set(counts.column_names):
        forms = [f for f, s in zip(counts.column("token_lower").to_pylist(),
                                   counts.column("token_stem").to_pylist(), strict=True)
                 if s == stem]
    else:
        rows = ix.table.search().where(token_filter([lower], "token_stem")).select(
            ["token_lower"]).limit(max(1, ix.word_rows([lower], "token_stem"))).to_arrow()
        forms = rows.column("token_lower").to_pylist()
    return [lower, *sorted(set(forms) - {lower})]


def main_forms(keys: pa.Table, vocab: list[str], candidate: np.ndarray) -> list[str]:
    """Each candidate word's most frequent lowercase form (stems are not words)."""
    counts = keys.group_by(["word", "token_lower"]).aggregate([("token_lower", "count")])
    best: dict[str, tuple[int, str]] = {}
    for stem, form, n in zip(*(counts.column(c).to_pylist() for c in
                               ("word", "token_lower", "token_lower_count")), strict=True):
        if stem not in best or (n, form) > best[stem]:
            best[stem] = (n, form)
    return [best[vocab[i]][1] for i in np.flatnonzero(candidate)]
