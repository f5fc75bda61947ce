"""What a corpus is: the files a glob of URIs lists (plain text, JSON Lines, Parquet on
any fsspec file system), how they are read (``ReadOptions``), and what reading yields.

Every input becomes either a ``Document`` or a ``DocError`` (what was wrong and where);
nothing raises for bad content, so one broken file never stops a corpus. Only user
mistakes about the command itself (a glob matching nothing, an unknown format) raise
``ElmoUserError``. Reading itself is ``pipeline/write/read.py``.

Document ids are given (JSON Lines ``id``, a Parquet id column) or derived
deterministically from the file's path relative to the glob's fixed prefix: ``a.txt:17``
for line 17 (1-based), ``a.txt`` for a whole file; the same corpus copied to another
machine or bucket gets the same ids, hence the same work items.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.write.setting import exposed
from schemas.files import open_fs

FORMATS = ("auto", "text", "jsonl", "parquet")
_EXTENSIONS = {
    ".txt": "text", ".text": "text", ".md": "text",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".parquet": "parquet", ".pq": "parquet",
}
BINARY_SAMPLE = 8192
_BINARY_MAGIC = (
    b"\x89PNG", b"\x1f\x8b", b"%PDF", b"PK\x03\x04", b"\x7fELF", b"GIF8", b"\xff\xd8\xff",
)


@dataclass(frozen=True)
class SourceFile:
    uri: str  # full URI with protocol
    path: str  # path as the file system knows it
    relative: str  # path relative to the glob's fixed prefix: the base of derived ids
    size: int
    version: str  # mtime or etag: lets a resumed run detect a changed input


@dataclass
class Document:
    doc_id: str
    source: str
    line: int | None
    text: str
    pretokenized: list[list[str]] | None = None
    metadata: dict[str, Any] | None = field(default=None)


@dataclass(frozen=True)
class DocError:
    doc_id: str
    source: str
    line: int | None
    reason: str


DOC_PER = ("line", "file")


@dataclass(frozen=True)
class ReadOptions:
    """How inputs are read; each field is also an ``elmo embed`` flag and a ``[read]`` key
    of a job spec (pipeline/write/setting.py)."""

    format: str = field(default="auto", metadata=exposed(
        flag="--format", job_key="read.format", choices=FORMATS,
        help="input format (default: by extension, else text)"))
    doc_per: str = field(default="line", metadata=exposed(
        flag="--doc-per", job_key="read.doc_per", choices=DOC_PER,
        help="text input: one document per line (default) or per file"))
    pretokenized: bool = field(default=False, metadata=exposed(
        flag="--pretokenized", job_key="read.pretokenized",
        help="input is already tokenized (whitespace-separated / 'tokens' lists)"))
    text_column: str = field(default="text", metadata=exposed(
        flag="--text-column", job_key="read.text_column",
        help="JSONL/Parquet text field (default %(default)s)"))
    id_column: str = field(default="id", metadata=exposed(
        flag="--id-column", job_key="read.id_column",
        help="JSONL/Parquet document id field (default %(default)s; a record without one "
             "is PATH:N)"))
    tokens_column: str = field(default="tokens", metadata=exposed(
        flag="--tokens-column", job_key="read.tokens_column",
        help="JSONL/Parquet field of token lists, with --pretokenized (default %(default)s)"))


def _fixed_prefix(pattern: str) -> str:
    """The directory part of a glob before its first wildcard."""
    cut = min((i for i, ch in enumerate(pattern) if ch in "*?["), default=None)
    if cut is None:
        return posixpath.dirname(pattern)
    return posixpath.dirname(pattern[:cut])


def list_sources(globs: list[str], storage_options: dict | None = None,
                 allow_missing: bool = False) -> list[SourceFile]:
    """Expand globs (any fsspec URI) into a sorted, de-duplicated list of files. A path
    that does not exist or a glob that matches no file is an ``ElmoUserError`` naming it
    (a typo beside good inputs would otherwise shrink the corpus unseen), unless
    ``allow_missing``; no file at all is one either way."""
    found: dict[str, SourceFile] = {}
    unmatched = []
    for pattern in globs:
        fs, path = open_fs(pattern, storage_options)
        if any(ch in path for ch in "*?["):
            matches = fs.glob(path, detail=True)
            prefix = _fixed_prefix(path)
        elif fs.isdir(path):  # a directory means every file below it
            matches = fs.find(path, detail=True)
            prefix = path.rstrip("/")
        elif fs.exists(path):
            matches = {path: fs.info(path)}
            prefix = posixpath.dirname(path)
        else:
            matches = {}
        if not any(info.get("type") != "directory" for info in matches.values()):
            unmatched.append(pattern)
        for match_path, info in sorted(matches.items()):
            if info.get("type") == "directory":
                continue
            uri = fs.unstrip_protocol(match_path)
            relative = posixpath.relpath(match_path, prefix) if prefix else match_path
            version = str(info.get("ETag") or info.get("etag") or info.get("mtime") or
                          info.get("LastModified") or info.get("created") or "")
            found.setdefault(uri, SourceFile(uri, match_path, relative, int(info.get("size") or 0),
                                             version))
    if not found:
        raise ElmoUserError(f"no input files match {' '.join(globs)!s}; check the path or glob")
    if unmatched and not allow_missing:
        raise ElmoUserError(f"no input files match {', '.join(unmatched)} (the other inputs "
                            "do); check the path or glob, or pass --allow-missing to embed "
                            "the rest")
    return sorted(found.values(), key=lambda s: s.uri)


def detect_format(source: SourceFile, requested: str) -> str:
    if requested != "auto":
        if requested not in FORMATS:
            raise SettingError("format", lambda name: (
                f"unknown {name('format')} {requested!r}; use one of {', '.join(FORMATS)}"))
        return requested
    ext = posixpath.splitext(source.path)[1].lower()
    return _EXTENSIONS.get(ext, "text")


def looks_binary(sample: bytes) -> bool:
    """A file is binary when it starts with a known magic number, or when more than 10%
    of its first 8 KiB are NUL/control bytes or invalid UTF-8 (a stray NUL in a text
    line is not enough: that line is still good text)."""
    if not sample:
        return False
    if sample.startswith(_BINARY_MAGIC):
        return True
    decoded = sample.decode("utf-8", errors="replace")
    # The sample may cut a multi-byte character at its end: ignore the last 3 chars.
    body = decoded[:-3] if len(decoded) > 16 else decoded
    bad = sum(1 for ch in body if ch == "\ufffd" or (ord(ch) < 32 and ch not in "\t\n\r\f\v"))
    return bad > 0.10 * max(1, len(body))
