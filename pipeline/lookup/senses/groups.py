"""Groups of documents by a field, for comparing a word's uses across them: each document's
group (its value, or its number's bin: ``--by year --bin 25``) and its block, the unit a
change score's null and bootstrap resample (``senses.change_scores``).

A field no document has, a field with one group, and ``--bin`` on a text field are user
errors that name what to pass instead; documents without the field are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import value_kind
from pipeline.lookup.senses.tables import bin_of, last_number

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.lookup.index.sense_index import SenseIndex


@dataclass
class DocumentGroups:
    labels: list[str]  # the groups, in order (numbers ascending, then text)
    doc_group: np.ndarray  # [documents] group of each document, -1: lacks the field
    doc_block: np.ndarray  # [documents] its block (global numbering), -1: none
    group_blocks: list[np.ndarray]  # each group's blocks (global numbers, consecutive)
    doc_of_rows: np.ndarray  # [rows] each key row's document, -1: its document lacks it
    left_out_docs: int = 0

    @property
    def n_blocks(self) -> int:
        return sum(len(b) for b in self.group_blocks)

    def blocks_of(self, group: int) -> np.ndarray:
        return self.group_blocks[group]


def _order(start: Any) -> tuple[int, Any]:
    return (0, start) if value_kind(start) in ("int", "float") else (1, str(start))


def group_values(ix: SenseIndex, parts: list[str], shards: list[int], doc_ids: list[str],
                 by: str, bin: float | None) -> tuple[list[str], list[int]]:
    """The groups of field ``by`` and each document's group (-1: no value), checked."""
    if bin is not None and not bin > 0:
        raise SettingError("bin", lambda name: (
            f"{name('bin')} must be a positive number, not {bin:g}"))
    documents = ix.documents()
    if by != "doc_id" and documents.ds is None:
        raise ElmoUserError(f"cannot read field {by!r}: {documents.unreadable}")
    values = [doc if by == "doc_id" else documents.of(part, shard, doc).get(by)
              for part, shard, doc in zip(parts, shards, doc_ids, strict=True)]
    present = [v for v in values if v is not None]
    if not present:
        raise SettingError("by", lambda name: (
            f"no document has a field {by!r}; pass {name('by')} one of "
            f"{', '.join(documents.names())}"))
    text = next((v for v in present if value_kind(v) not in ("int", "float")), None)
    if bin is not None and text is not None:
        raise SettingError("bin", lambda name: (
            f"{by} holds text (e.g. {str(text)!r}), which has no bins; leave out "
            f"{name('bin')}"))
    starts: dict[str, Any] = {}
    doc_labels = []
    last = last_number(present)
    for value in values:
        if value is None:
            doc_labels.append(None)
            continue
        start, label = bin_of(value if value_kind(value) else str(value), bin, last)
        starts.setdefault(label, start)
        doc_labels.append(label)
    labels = sorted(starts, key=lambda label: _order(starts[label]))
    if len(labels) < 2:
        raise SettingError("by", lambda name: (
            f"every document with {by} is in one group ({labels[0]}), so there is nothing "
            f"to compare; pass {name('by')} a field with two values or more"
            f"{' or a smaller ' + name('bin') if bin is not None else ''}"))
    number = {label: i for i, label in enumerate(labels)}
    return labels, [-1 if label is None else number[label] for label in doc_labels]


def document_groups(ix: SenseIndex, keys: pa.Table, by: str, bin: float | None,
                    blocks: int, rng: np.random.Generator) -> DocumentGroups:
    """Groups and blocks of the documents of index rows ``keys`` (columns ``part``,
    ``shard``, ``doc_id``): each group's documents, shuffled, are dealt into
    ``min(blocks, documents)`` blocks."""
    import pyarrow as pa
    import pyarrow.compute as pc

    key = pc.binary_join_element_wise(
        keys.column("part"), pc.cast(keys.column("shard"), pa.string()), keys.column("doc_id"),
        "\x00")
    unique = pc.unique(key)
    doc_of_rows = pc.index_in(key, value_set=unique).to_numpy(zero_copy_only=False)
    split = [k.split("\x00", 2) for k in unique.to_pylist()]
    labels, doc_group_list = group_values(ix, [s[0] for s in split],
                                          [int(s[1]) for s in split], [s[2] for s in split],
                                          by, bin)
    doc_group = np.array(doc_group_list, np.int64)
    doc_block = np.full(len(doc_group), -1, np.int64)
    group_blocks, first = [], 0
    for g in range(len(labels)):
        members = rng.permutation(np.flatnonzero(doc_group == g))
        count = min(blocks, len(members))
        doc_block[members] = first + np.arange(len(members)) % count
        group_blocks.append(np.arange(first, first + count))
        first += count
    doc_of_rows = np.where(doc_group[doc_of_rows] >= 0, doc_of_rows, -1)
    return DocumentGroups(labels, doc_group, doc_block, group_blocks, doc_of_rows,
                          int((doc_group < 0).sum()))
