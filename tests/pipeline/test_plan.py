"""The streaming plan: work items cut from file sizes alone, and the worker-side reading
of an item's byte range (lines / row groups that start in it), checked against reading
whole files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.write.inputs import DocError, Document, ReadOptions, list_sources
from pipeline.write.plan import WorkItem, item_bytes, plan_items
from pipeline.write.read import LineCounter, read_documents, read_range


def as_tuples(items: list[Document | DocError]) -> list[tuple]:
    return [(d.doc_id, d.line, d.text if isinstance(d, Document) else d.reason) for d in items]


def read_items(items: list[WorkItem], opts: ReadOptions, shared_counter: bool) -> list:
    """Read every item; with a fresh line counter per item (another worker each time) or
    one shared counter (one worker, items in order)."""
    counter = LineCounter()
    out = []
    for item in items:
        out += read_range(item.source, item.start, item.end, opts, None,
                          counter if shared_counter else LineCounter())
    return out


@pytest.fixture
def awkward_text(tmp_path: Path) -> Path:
    lines = ["\ufeffFirst line with a BOM.", "", "   ", "second \u00e9\u00e8 line", "x" * 500,
             "short", "", "", "bad \udcff", "a\r", "last line without newline"]
    data = "\n".join(lines).encode("utf-8", errors="surrogateescape")
    (tmp_path / "t.txt").write_bytes(data.replace(b"\\udcff", b"\xff"))
    return tmp_path / "t.txt"


@pytest.mark.parametrize("target", [1, 3, 7, 40, 120, 10_000])
@pytest.mark.parametrize("shared_counter", [True, False])
def test_text_ranges_read_exactly_the_whole_file(awkward_text: Path, target: int,
                                                 shared_counter: bool) -> None:
    sources = list_sources([str(awkward_text)])
    opts = ReadOptions()
    items = list(plan_items(sources, opts, target))
    assert [i.index for i in items] == list(range(len(items)))
    # Ranges tile the file: no byte owned twice, none missed.
    assert items[0].start == 0 and items[-1].end == sources[0].size
    assert all(a.end == b.start for a, b in itertools.pairwise(items))
    whole = as_tuples(list(read_documents(sources, opts)))
    assert whole and whole[0] == ("t.txt:1", 1, "First line with a BOM.")
    assert ("t.txt:9", 9, "invalid UTF-8 at byte 4") in whole
    got = as_tuples(read_items(items, opts, shared_counter))
    assert got == whole
    # Out of order (another actor took the earlier items): the same documents.
    if not shared_counter:
        assert sorted(as_tuples(read_items(items[::-1], opts, True))) == sorted(whole)


def test_jsonl_and_parquet_ranges(tmp_path: Path) -> None:
    records = [{"id": f"r{i}", "text": f"Record number {i}."} if i % 3 else {"text": f"No id {i}."}
               for i in range(60)]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    table = pa.table({"text": [f"Row {i} here." for i in range(100)],
                      "id": [None if i % 7 == 0 else f"p{i}" for i in range(100)]})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=9)
    sources = list_sources([f"{tmp_path}/*"])
    opts = ReadOptions()
    whole = as_tuples(list(read_documents(sources, opts)))
    assert ("r.jsonl:1", 1, "No id 0.") in whole and ("p.parquet:8", 8, "Row 7 here.") in whole
    for target in (50, 333, 1000):
        items = list(plan_items(sources, opts, target))
        assert len(items) > len(sources)  # both files are cut
        assert as_tuples(read_items(items, opts, shared_counter=False)) == whole


def test_item_size_and_determinism(tmp_path: Path) -> None:
    for name, size in (("a.txt", 1000), ("b.txt", 10), ("c.txt", 0)):
        (tmp_path / name).write_bytes(b"word line\n" * (size // 10))
    sources = list_sources([f"{tmp_path}/*.txt"])
    target = item_bytes(sources, item_tokens=10**6, min_items=8)
    assert target == 1010 // 8 + 1  # the corpus makes at least 8 items
    items = list(plan_items(sources, ReadOptions(), target))
    assert items == list(plan_items(sources, ReadOptions(), target))  # deterministic
    assert len(items) >= 8
    # An empty file is one item (it reports the file as empty); so is a whole-file
    # document, whatever its size.
    empty = [i for i in items if i.source.path.endswith("c.txt")]
    assert len(empty) == 1
    whole = list(plan_items(sources, ReadOptions(doc_per="file"), target))
    assert len(whole) == 3 and [i.end for i in whole] == [1000, 10, 1]
    assert item_bytes(sources, item_tokens=10, min_items=1) == 50  # 10 tokens x 5 bytes
