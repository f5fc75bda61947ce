"""Read a work item's documents (pipeline/write/plan.py): the lines, or Parquet row groups, of a
file that start in a byte range, as ``Document``s and ``DocError``s (pipeline/write/inputs.py).

Line numbers stay those of the whole file (``LineCounter`` counts the newlines before a
range), so ids do not depend on how a file was cut; ``read_documents`` reads whole files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from elmo_model.errors import SettingError
from pipeline.write.inputs import (
    BINARY_SAMPLE,
    DOC_PER,
    DocError,
    Document,
    ReadOptions,
    SourceFile,
    detect_format,
    looks_binary,
)
from schemas.files import open_fs


def _check_text(text: str) -> str | None:
    """Why ``text`` cannot be stored, or None. Arrow strings must be valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text contains unpaired surrogate code points"
    if not text.strip():
        return "empty document"
    return None


def _document(doc_id: str, source: SourceFile, line: int | None, text: str | None,
              tokens: Any, metadata: dict | None, pretokenized: bool) -> Document | DocError:
    if pretokenized:
        if isinstance(tokens, str) or tokens is None:
            tokens = (text or tokens or "").split()
        sentences = tokens if tokens and isinstance(tokens[0], list) else [tokens]
        if not all(isinstance(t, str) for s in sentences for t in s):
            return DocError(doc_id, source.uri, line, "pre-tokenized tokens must be strings")
        if any(t == "" or any(c.isspace() for c in t) for s in sentences for t in s):
            return DocError(doc_id, source.uri, line, "empty token or whitespace inside a token")
        sentences = [list(s) for s in sentences if s]
        text = "\n".join(" ".join(s) for s in sentences)
        reason = _check_text(text)
        if reason:
            return DocError(doc_id, source.uri, line, reason)
        return Document(doc_id, source.uri, line, text, sentences, metadata)
    if not isinstance(text, str):
        return DocError(doc_id, source.uri, line, f"text is {type(text).__name__}, not a string")
    reason = _check_text(text)
    if reason:
        return DocError(doc_id, source.uri, line, reason)
    return Document(doc_id, source.uri, line, text, None, metadata)


class LineCounter:
    """Newlines before a byte offset of a file, remembered between the items of one worker.

    Derived document ids carry the line number (``a.txt:17``), so an item that starts in
    the middle of a large file must know how many lines precede it. The driver never reads
    text, so the worker counts: from the nearest offset it has seen (the end of its
    previous item of that file, usually) to its own start. An executor that runs items in
    order (local) never re-reads a byte; with N Ray actors each reads a large file's bytes
    about N times in all, cheap next to embedding them.
    """

    def __init__(self, max_files: int = 64) -> None:
        self.max_files = max_files
        self._marks: dict[tuple[str, str], dict[int, int]] = {}

    def remember(self, source: SourceFile, offset: int, newlines: int) -> None:
        key = (source.uri, source.version)
        marks = self._marks.pop(key, {})
        marks[offset] = newlines
        self._marks[key] = marks  # most recently used last
        while len(self._marks) > self.max_files:
            self._marks.pop(next(iter(self._marks)))
        if len(marks) > 1024:  # keep the latest offsets of a huge file
            for old in sorted(marks)[:-512]:
                del marks[old]

    def newlines_before(self, fs: Any, source: SourceFile, offset: int) -> int:
        """Number of ``\\n`` bytes in ``[0, offset)`` of the file."""
        if offset <= 0:
            return 0
        marks = self._marks.get((source.uri, source.version), {})
        known = max((o for o in marks if o <= offset), default=0)
        count = marks.get(known, 0)
        with fs.open(source.path, "rb") as handle:
            handle.seek(known)
            left = offset - known
            while left > 0:
                chunk = handle.read(min(left, 8 << 20))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                left -= len(chunk)
        self.remember(source, offset, count)
        return count


def _read_range(fs: Any, source: SourceFile, start: int, end: int) -> tuple[int, bytes]:
    """``(base, bytes from base)``: the byte before ``start`` (to tell whether a line
    starts at ``start``), the range, and the rest of the line that crosses ``end``."""
    base = max(0, start - 1)
    with fs.open(source.path, "rb") as handle:
        handle.seek(base)
        data = handle.read(end - base)
        if end < source.size:
            tail = [data]
            while True:
                chunk = handle.read(1 << 16)
                tail.append(chunk)
                if not chunk or b"\n" in chunk:
                    break
            data = b"".join(tail)
    return base, data


def _owned_lines(fs: Any, source: SourceFile, start: int, end: int, counter: LineCounter,
                 data: bytes, base: int) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` of the lines that *start* in ``[start, end)`` (a range
    owns the lines that start in it, so consecutive ranges share none and miss none)."""
    if start == 0:
        pos = 0
    else:
        newline = data.find(b"\n")  # data[0] is the byte before start
        if newline < 0:
            return
        pos = newline + 1
    before = counter.newlines_before(fs, source, base)
    number = before + data.count(b"\n", 0, pos) + 1
    if end < source.size:  # the next item of this file starts counting here
        counter.remember(source, end - 1, before + data.count(b"\n", 0, max(0, end - 1 - base)))
    limit = end - base
    while pos < limit and pos <= len(data):
        newline = data.find(b"\n", pos)
        stop = len(data) if newline < 0 else newline
        yield number, data[pos:stop]
        number += 1
        if newline < 0:
            return
        pos = newline + 1


def _check_head(source: SourceFile, head: bytes, kind: str) -> DocError | None:
    """The error for a binary or empty file (judged on its first bytes), or None."""
    if looks_binary(head[:BINARY_SAMPLE]):
        return DocError(source.relative, source.uri, None, f"binary file (not {kind})")
    if source.size <= len(head) and not head.strip():
        return DocError(source.relative, source.uri, None, "empty file")
    return None


def _line_source(fs: Any, source: SourceFile, start: int, end: int, kind: str,
                 counter: LineCounter) -> Iterator[tuple[int, bytes]] | DocError | None:
    """The owned lines of a range, a DocError for the whole file (reported by the item
    that starts at byte 0), or None (a later range of a bad file: nothing to report)."""
    base, data = _read_range(fs, source, start, end)
    if start == 0:
        head = data
    else:
        with fs.open(source.path, "rb") as handle:
            head = handle.read(BINARY_SAMPLE)
    error = _check_head(source, head, kind)
    if error is not None:
        return error if start == 0 else None
    return _owned_lines(fs, source, start, end, counter, data, base)


def _read_text(fs: Any, source: SourceFile, opts: ReadOptions, start: int, end: int,
               counter: LineCounter) -> Iterator[Document | DocError]:
    if opts.doc_per == "file":  # one document: always a whole-file item (pipeline/write/plan.py)
        with fs.open(source.path, "rb") as handle:
            data = handle.read()
        error = _check_head(source, data, "text")
        if error is not None:
            yield error
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            yield DocError(source.relative, source.uri, None,
                           f"invalid UTF-8 at byte {error.start}")
            return
        yield _document(source.relative, source, None, text.removeprefix("\ufeff"), None, None,
                        opts.pretokenized)
        return
    lines = _line_source(fs, source, start, end, "text", counter)
    if lines is None or isinstance(lines, DocError):
        yield from [lines] if lines else []
        return
    for number, raw in lines:
        raw = raw.removesuffix(b"\r")
        doc_id = f"{source.relative}:{number}"
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is not text
        if not raw.strip():
            continue  # blank lines separate documents; they are not documents themselves
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            yield DocError(doc_id, source.uri, number, f"invalid UTF-8 at byte {error.start}")
            continue
        yield _document(doc_id, source, number, text, None, None, opts.pretokenized)


def _read_jsonl(fs: Any, source: SourceFile, opts: ReadOptions, start: int, end: int,
                counter: LineCounter) -> Iterator[Document | DocError]:
    lines = _line_source(fs, source, start, end, "JSON Lines", counter)
    if lines is None or isinstance(lines, DocError):
        yield from [lines] if lines else []
        return
    for number, raw in lines:
        if not raw.strip():
            continue
        fallback_id = f"{source.relative}:{number}"
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            yield DocError(fallback_id, source.uri, number, f"invalid JSON: {error}"[:300])
            continue
        if not isinstance(record, dict):
            yield DocError(fallback_id, source.uri, number, "a JSON Lines record must be an object")
            continue
        doc_id = record.get(opts.id_column)
        doc_id = fallback_id if doc_id is None else str(doc_id)
        if opts.pretokenized and opts.tokens_column in record:
            tokens = record[opts.tokens_column]
        else:
            tokens = None
            if opts.text_column not in record:
                yield DocError(doc_id, source.uri, number, f"no {opts.text_column!r} field")
                continue
        extra = {k: v for k, v in record.items()
                 if k not in (opts.id_column, opts.text_column, opts.tokens_column)}
        yield _document(doc_id, source, number, record.get(opts.text_column), tokens,
                        extra or None, opts.pretokenized)


def row_group_offset(metadata: Any, index: int) -> int:
    """Byte offset where row group ``index`` starts: the item whose range holds it owns it."""
    column = metadata.row_group(index).column(0)
    if column.has_dictionary_page and column.dictionary_page_offset:
        return int(min(column.dictionary_page_offset, column.data_page_offset))
    return int(column.data_page_offset)


def _read_parquet(fs: Any, source: SourceFile, opts: ReadOptions, start: int, end: int,
                  counter: LineCounter) -> Iterator[Document | DocError]:
    import pyarrow.parquet as pq

    try:
        handle = fs.open(source.path, "rb")
        parquet = pq.ParquetFile(handle)
    except Exception as error:  # a corrupt or non-Parquet file is bad input, not a crash
        if start == 0:
            yield DocError(source.relative, source.uri, None, f"unreadable Parquet: {error}"[:300])
        return
    with handle:
        names = parquet.schema_arrow.names
        wanted = opts.tokens_column if opts.pretokenized else opts.text_column
        if wanted not in names:
            if start == 0:
                yield DocError(source.relative, source.uri, None,
                               f"no column {wanted!r} in {names}")
            return
        meta = parquet.metadata
        owned = [g for g in range(meta.num_row_groups)
                 if start <= row_group_offset(meta, g) < end
                 or (start == 0 and row_group_offset(meta, g) < 0)]
        if not owned:
            return
        # Row numbers count from the file's first row: ids do not depend on the item size.
        number = sum(meta.row_group(g).num_rows for g in range(owned[0]))
        columns = [wanted] + ([opts.id_column] if opts.id_column in names else [])
        for batch in parquet.iter_batches(columns=columns, batch_size=4096, row_groups=owned):
            values = batch.column(wanted).to_pylist()
            ids = batch.column(opts.id_column).to_pylist() if len(columns) > 1 else None
            for k, value in enumerate(values):
                number += 1
                doc_id = f"{source.relative}:{number}" if ids is None or ids[k] is None \
                    else str(ids[k])
                if value is None:
                    yield DocError(doc_id, source.uri, number, f"{wanted} is null")
                    continue
                if opts.pretokenized:
                    yield _document(doc_id, source, number, None, value, None, True)
                else:
                    yield _document(doc_id, source, number, value, None, None, False)


_READERS = {"text": _read_text, "jsonl": _read_jsonl, "parquet": _read_parquet}


def read_range(source: SourceFile, start: int, end: int, opts: ReadOptions,
               storage_options: dict | None = None, counter: LineCounter | None = None
               ) -> Iterator[Document | DocError]:
    """Documents (or errors) of the part of one file that bytes ``[start, end)`` own:
    text and JSON Lines lines that start there, Parquet row groups that start there.
    A document id appears once per range: a repeat becomes a ``duplicate doc_id`` error."""
    fs, _ = open_fs(source.uri, storage_options)
    reader = _READERS[detect_format(source, opts.format)]
    try:
        items = list(reader(fs, source, opts, start, end, counter or LineCounter()))
    except OSError as error:
        items = [DocError(source.relative, source.uri, None, f"cannot read: {error}"[:300])]
    seen: set[str] = set()
    for item in items:
        if isinstance(item, Document):
            if item.doc_id in seen:
                item = DocError(item.doc_id, item.source, item.line, "duplicate doc_id")
            else:
                seen.add(item.doc_id)
        yield item


def read_documents(sources: list[SourceFile], opts: ReadOptions,
                   storage_options: dict | None = None) -> Iterator[Document | DocError]:
    """Documents (or errors) of every source, whole files, in source order then line
    order (benchmarks and tools; the pipeline reads work items with ``read_range``)."""
    if opts.doc_per not in DOC_PER:
        raise SettingError("doc_per", lambda name: (
            f"{name('doc_per')} must be 'line' or 'file', not {opts.doc_per!r}"))
    counter = LineCounter()
    for source in sources:
        yield from read_range(source, 0, max(source.size, 1), opts, storage_options, counter)
