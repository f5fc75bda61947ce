"""Stage 1, on the driver: cut the listed sources into work items, without reading text.

A *work item* is the unit of planning, execution and commit. It is a byte range of one
source file and owns:

- text / JSON Lines (one document per line): the lines that *start* in the range, so
  consecutive ranges share no line and miss none, whatever the line lengths;
- Parquet: the row groups that start in the range;
- a whole file, when the file is smaller than one item or is one document
  (``--doc-per file``).

Items are numbered 0, 1, ... in source order (sorted URIs) then byte order, and their
ranges depend only on the files' sizes and the item size, which depends only on the
sizes, ``item_tokens`` and ``min_items``. So the same inputs and options give the same
items on every run (``plan.json`` records all three), a resumed run recomputes exactly
the uncommitted ones, and item ``k``'s files are ``<table>/shard=<k>/<part>.parquet``.
The driver keeps no item list: ``plan_items`` is a generator.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from pipeline.write.inputs import ReadOptions, SourceFile, detect_format

# Bytes of input per token, to size items from file sizes. Measured: 4.7 for English
# prose (austen.txt: 4.0 MB, 0.86M tokens); JSON and markup run higher, which only makes
# items a little smaller than the target.
BYTES_PER_TOKEN = 5


@dataclass(frozen=True)
class WorkItem:
    index: int  # the item's number in the plan: its shard number in the dataset
    source: SourceFile
    start: int  # byte range [start, end) of the file (see the module docstring)
    end: int

    @property
    def input_bytes(self) -> int:
        return self.end - self.start

    def describe(self) -> dict:
        """What the manifest records of the item: enough to find its input again."""
        return {"source": self.source.uri, "start": self.start, "end": self.end}

    def where(self) -> str:
        return f"{self.source.uri} bytes {self.start}-{self.end}"


def item_bytes(sources: list[SourceFile], item_tokens: int, min_items: int) -> int:
    """Target bytes per item: ``item_tokens`` worth, but small enough that the corpus
    makes at least ``min_items`` items (so a small corpus still spreads over actors)."""
    total = sum(s.size for s in sources)
    return max(1, min(item_tokens * BYTES_PER_TOKEN, math.ceil(total / max(1, min_items))))


def _splittable(source: SourceFile, read: ReadOptions) -> bool:
    fmt = detect_format(source, read.format)
    return fmt in ("jsonl", "parquet") or (fmt == "text" and read.doc_per == "line")


def plan_items(sources: list[SourceFile], read: ReadOptions, target_bytes: int
               ) -> Iterator[WorkItem]:
    """Every work item of the sources, in order (see the module docstring)."""
    index = 0
    for source in sources:
        size = max(source.size, 0)
        pieces = 1 if size <= target_bytes or not _splittable(source, read) else \
            math.ceil(size / target_bytes)
        bounds = [size * j // pieces for j in range(pieces + 1)]
        # An empty file still gets one item: it reports the file as empty.
        bounds[-1] = max(bounds[-1], 1)
        for start, end in itertools.pairwise(bounds):
            yield WorkItem(index, source, start, end)
            index += 1


def plan_record(sources: list[SourceFile], read: ReadOptions, target_bytes: int) -> dict:
    """What ``plan.json`` records: a resumed run must plan the same items."""
    return {"sources": [[s.uri, s.size, s.version] for s in sources],
            "read": asdict(read), "item_bytes": target_bytes,
            "item_rule": "byte ranges; a range owns the lines / row groups starting in it"}
