"""Prose out of the fetched artifacts: HTML pages, the addresses' JSON, Wikipedia leads,
and the plain-text corpus, each as :class:`Document` records of cleaned paragraphs.

HTML keeps only the text of paragraph-like elements (``p``, ``li``, ``dd``) outside
containers that never hold running prose: code blocks, tables, navigation, headers and
footers, sidebars, signatures, admonition titles and heading anchors. Inline code inside a
paragraph stays, since removing it would cut the sentence it belongs to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

# A paragraph shorter than this is a label, a heading or a fragment, not prose.
MIN_PARAGRAPH_WORDS = 5
_SPACE_RE = re.compile(r"\s+")
_PARAGRAPH_BREAK_RE = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class Document:
    """One document of one source: its id, its paragraphs and what is known about it."""

    source: str
    doc_id: str
    paragraphs: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)


def count_words(text: str) -> int:
    """Whitespace-separated words, as ``wc -w`` counts them (the corpora's README counts)."""
    return len(text.split())


def clean_paragraph(text: str) -> str:
    """One line of prose: whitespace runs (newlines included) become one space, and the
    pilcrows Sphinx adds to headings go."""
    return _SPACE_RE.sub(" ", text.replace("\u00b6", " ")).strip()


def keep_paragraph(text: str) -> bool:
    return count_words(text) >= MIN_PARAGRAPH_WORDS and any(ch.isalpha() for ch in text)


def clean_paragraphs(raw: list[str]) -> tuple[str, ...]:
    cleaned = (clean_paragraph(p) for p in raw)
    return tuple(p for p in cleaned if keep_paragraph(p))


# Elements whose whole content is skipped, and classes/roles/ids that mark containers of
# navigation, code or boilerplate in Sphinx (kernel, Python) and DocBook (PostgreSQL, the
# Debian handbook) pages.
_SKIP_TAGS = {"script", "style", "pre", "table", "nav", "header", "footer", "form", "dt",
              "noscript", "svg", "button", "select", "textarea", "h1", "h2", "h3", "h4",
              "h5", "h6", "title", "head"}
_SKIP_CLASSES = {"highlight", "sphinxsidebar", "related", "footer", "navheader", "navfooter",
                 "toctree-wrapper", "admonition-title", "headerlink", "sig", "searchbox",
                 "kerneltoc", "programlisting", "screen", "synopsis", "literallayout",
                 "toc", "mobile-nav", "menu-wrapper", "language-selection", "rubric",
                 "version_switcher_placeholder", "language_switcher_placeholder",
                 "footnotes", "copyright", "breadcrumbs", "contents", "docnav", "titlepage"}
_SKIP_ROLES = {"navigation", "search", "note", "banner", "contentinfo"}
_BLOCK_TAGS = {"p", "li", "dd"}
# Publican's DocBook pages (the Debian handbook) put each paragraph in a div of this class.
_BLOCK_DIV_CLASS = "para"
# Void elements never get an end tag, so they must not enter the open-element stack.
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
              "source", "track", "wbr"}


def _skips(tag: str, attrs: list[tuple[str, str | None]]) -> bool:
    if tag in _SKIP_TAGS:
        return True
    values = dict(attrs)
    classes = set((values.get("class") or "").split())
    if any(c in _SKIP_CLASSES or c.startswith("highlight-") for c in classes):
        return True
    return values.get("role") in _SKIP_ROLES or values.get("id") in {"searchbox", "toc"}


class _ProseParser(HTMLParser):
    """Collects the text of paragraph-like elements outside skipped containers."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self.title = ""
        self._stack: list[tuple[str, bool, bool]] = []  # (tag, skips, opens a block)
        self._skip_depth = 0
        self._block_depth = 0
        self._parts: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _VOID_TAGS:
            if tag == "br":
                self._parts.append(" ")
            return
        skips = _skips(tag, attrs)
        # A block inside a block (a p inside an li) continues it: flush the outer text first.
        block = tag in _BLOCK_TAGS or (
            tag == "div" and _BLOCK_DIV_CLASS in (dict(attrs).get("class") or "").split())
        if block:
            self._flush()
        self._stack.append((tag, skips, block))
        self._skip_depth += skips
        self._block_depth += block

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _VOID_TAGS or not any(open_tag == tag for open_tag, _, _ in self._stack):
            return
        # Close everything opened after the matching tag (HTML lets authors omit end tags).
        while self._stack:
            open_tag, skips, block = self._stack.pop()
            self._skip_depth -= skips
            self._block_depth -= block
            if block:
                self._flush()
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif self._block_depth and not self._skip_depth:
            self._parts.append(data)

    def _flush(self) -> None:
        if self._parts:
            self.paragraphs.append("".join(self._parts))
            self._parts = []

    def close(self) -> None:
        super().close()
        self._flush()


def html_prose(html: str) -> tuple[str, tuple[str, ...]]:
    """The page title and its cleaned prose paragraphs."""
    parser = _ProseParser()
    parser.feed(html)
    parser.close()
    return clean_paragraph(parser.title), clean_paragraphs(parser.paragraphs)


def html_documents(source: str, root: Path, package: str, prefix: str = "",
                   exclude: re.Pattern[str] | None = None) -> Iterator[Document]:
    """One document per HTML page under ``root`` (sorted paths, so reruns agree); its
    path is ``prefix`` + its path under ``root``, and a page whose path ``exclude``
    matches is not read."""
    for path in sorted(root.rglob("*.html")):
        relative = prefix + path.relative_to(root).as_posix()
        if exclude is not None and exclude.search(relative):
            continue
        title, paragraphs = html_prose(path.read_text(encoding="utf-8", errors="replace"))
        if paragraphs:
            yield Document(source, f"{source}/{relative}", paragraphs,
                           {"package": package, "path": relative, "title": title})


def split_paragraphs(text: str) -> tuple[str, ...]:
    return clean_paragraphs(_PARAGRAPH_BREAK_RE.split(text))


def sotu_documents(source: str, data_dir: Path) -> Iterator[Document]:
    """One document per address: ``YEAR_NAME_PARTY.json`` holds year, president, party and
    text (the ``.txt`` beside it is the same text)."""
    for path in sorted(data_dir.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        paragraphs = split_paragraphs(record["text"])
        if paragraphs:
            yield Document(source, f"{source}/{path.stem}", paragraphs,
                           {"year": int(record["year"]), "president": record["name"],
                            "party": record.get("party")})


def wikipedia_documents(source: str, summaries: Path) -> Iterator[Document]:
    """One document per article lead, in title order."""
    records = json.loads(summaries.read_text(encoding="utf-8"))
    for title in sorted(records):
        record = records[title]
        paragraphs = split_paragraphs(record.get("extract") or "")
        if paragraphs:
            yield Document(source, f"{source}/{title}", paragraphs,
                           {"title": record.get("title", title), "topic": record.get("topic"),
                            "description": record.get("description")})


def line_documents(source: str, directory: Path) -> Iterator[Document]:
    """The plain-text corpus, one paragraph (speech, verse) per line: each line is a
    document, as the bundled model's training made each line a sequence."""
    for path in sorted(directory.glob("*.txt")):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                paragraph = line.strip()
                if paragraph:
                    yield Document(source, f"{source}/{path.name}:{number}", (paragraph,),
                                   {"work": path.stem, "line": number})


# POD (Perl's documentation format): E<> escapes by name, the rest by number.
_POD_ESCAPES = {"lt": "<", "gt": ">", "sol": "/", "verbar": "|", "quot": '"', "amp": "&",
                "apos": "'", "nbsp": " "}
# Innermost single-angle format codes (no angle brackets inside), and double-angle ones,
# which may hold "->" or "=>" (C<< $a->b >>).
_POD_SINGLE_RE = re.compile(r"([A-Z])<([^<>]*)>")
_POD_MULTI_RE = re.compile(r"([A-Z])(<{2,})\s(.*?)\s(>{2,})", re.DOTALL)


def _pod_code(letter: str, inner: str) -> str:
    if letter in "XZ":  # index entries and zero-width markers print nothing
        return ""
    if letter == "E":
        if inner.isdigit():
            return chr(int(inner))
        return _POD_ESCAPES.get(inner, "")
    if letter == "L":  # L<text|target> prints its text; L<page/"section"> its names
        text = inner.split("|", 1)[0]
        return text.replace('/"', " ").replace('"', "").replace("/", " ").strip()
    return inner


def pod_text(paragraph: str) -> str:
    """An ordinary POD paragraph as plain text: format codes replaced by what they print."""
    paragraph = _POD_MULTI_RE.sub(lambda m: _pod_code(m.group(1), m.group(3)), paragraph)
    while True:
        replaced = _POD_SINGLE_RE.sub(lambda m: _pod_code(m.group(1), m.group(2)), paragraph)
        if replaced == paragraph:
            return replaced
        paragraph = replaced


def pod_paragraphs(text: str) -> tuple[str, ...]:
    """The prose of a POD file: its ordinary paragraphs. Commands (``=head2``, ``=item``),
    verbatim paragraphs (indented: code), ``=begin``/``=end`` and ``=for`` blocks and code
    after ``=cut`` are left out."""
    prose = []
    in_pod, in_block = True, 0
    for block in _PARAGRAPH_BREAK_RE.split(text.replace("\r\n", "\n")):
        if not block.strip():
            continue
        if block.startswith("="):
            command = block.split(None, 1)[0]
            if command == "=cut":
                in_pod = False
            else:
                in_pod = True
                in_block += (command == "=begin") - (command == "=end" and in_block > 0)
            continue
        if in_pod and not in_block and not block[0].isspace():
            prose.append(pod_text(block))
    return clean_paragraphs(prose)


def pod_documents(source: str, root: Path, package: str) -> Iterator[Document]:
    """One document per ``.pod`` file under ``root`` (sorted paths)."""
    for path in sorted(root.rglob("*.pod")):
        paragraphs = pod_paragraphs(path.read_text(encoding="utf-8", errors="replace"))
        relative = path.relative_to(root).as_posix()
        if paragraphs:
            yield Document(source, f"{source}/{relative}", paragraphs,
                           {"package": package, "path": relative, "title": path.stem})
