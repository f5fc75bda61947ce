"""Prose out of PDF documentation (TeX Live's package manuals) as :class:`Document` records.

``pdftotext`` gives each page's text in reading order, blocks separated by blank lines. Running
heads and page numbers go first, so that a paragraph broken by a page break is one again. A
block is cut into paragraphs at code lines, footnotes, list items and short lines; a
paragraph's lines are joined (words hyphenated at a line end whole again), an unfinished last
sentence (cut by a display) goes, and the paragraph is kept only when it reads as running
prose: mostly alphabetic words, little LaTeX markup, a sentence's end. A document whose prose
is not English (many manuals are German, French, Italian, Russian...) is left out whole, and an
English one loses its paragraphs in other languages and its lorem ipsum.
"""

from __future__ import annotations

import html
import re
import shutil
import statistics
import subprocess
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from elmo_model.corpus.extract import Document, clean_paragraphs
from elmo_model.errors import ElmoUserError

# The largest manual converts in seconds (BENCHMARKS.md, "Figures once in code"): a
# minute means a broken file.
TIMEOUT_S = 60.0
# pdftotext runs in its own process, so two threads keep two cores busy.
WORKERS = 2

# Paragraph rules (measured on texlive-latex-extra-doc): a paragraph must pass all of them.
MIN_WORD_SHARE = 0.75  # alphabetic words among tokens: tables, math, numbers, URLs fail
MAX_CODE_SHARE = 0.15  # tokens holding LaTeX or math characters: code, macro lists fail
MAX_SINGLE_LETTER_SHARE = 0.15  # one-letter words other than a/A/I: math variables, columns
MIN_DISTINCT_SHARE = 0.25  # distinct words in 20 or more: filler ("test page test page")
MIN_TAIL_WORDS = 10  # words of a paragraph that starts in lowercase
# A line shorter than this share of its block's median line ends a paragraph.
SHORT_LINE = 0.7
# A document is English when English function words are at least this share of its prose
# words and outnumber the other languages' ones: English manuals measure 0.2-0.4, German,
# French or Italian ones under 0.03, English samples full of lorem ipsum 0.07.
MIN_ENGLISH_SHARE = 0.05

# -htmlmeta wraps the plain text (page breaks included) in <pre> after a <head> holding the
# document's Title, so one run gives both; the text itself is written unescaped.
_BODY_START = "<body>\n<pre>\n"
_BODY_END = "</pre>\n</body>\n</html>\n"
_TITLE_RE = re.compile(r"<title>(.*?)</title>", re.S)

_BLOCK_BREAK_RE = re.compile(r"\n[ \t]*\n")
# Characters of LaTeX source and math, rare in prose.
_CODE_CHARS = frozenset("\\{}%$^_#@&=<>|~⟨⟩")
# A numbered listing line (the implementation part of a .dtx manual) or a line number alone.
_LISTING_LINE_RE = re.compile(r"^\d+(?:\s*$|\s+[\\%{}#@])")
# A footnote starts with a mark (∗ † ‡, or a small number before a capital), a list item with
# a bullet, each on a line of its own.
_FOOTNOTE_RE = re.compile(r"^(?:[∗*†‡§¶]\s*\S|\d{1,2}\s+[A-Z])")
_BULLET_RE = re.compile(r"^[•◦▪‣]\s*\S")
# Marks before a list item or footnote, and symbol glyphs after a paragraph (icons, dingbats).
_LEADING_MARK_RE = re.compile(r"^(?:[•◦▪‣∗*†‡–—-]|\d{1,2}(?=\s+[A-Z]))\s+")
_TRAILING_SYMBOLS_RE = re.compile(r"(?:\s+[^\w\s.!?:)\]”’\"']+)+$")
_HYPHEN_END_RE = re.compile(r"([^\W\d_]+)-\Z")
# Dot leaders of a table of contents or an index.
_LEADER_RE = re.compile(r"(?:\.\s){3}|\.{4}|…\s*…")
# Prose ends a sentence (a colon introduces an example, still a sentence).
_SENTENCE_END_RE = re.compile(r"[.!?:][)\]”’\"']*$")
# A sentence's end inside a paragraph: the next word starts with a capital.
_INNER_END_RE = re.compile(r"[.!?][)\]”’\"']*(?=\s+[\\“\"‘'(]*[A-Z])")
# A bibliography entry: [1] or [Knu84] at its start.
_REFERENCE_RE = re.compile(r"^\[[\w+.\-]{1,12}\]")
_TOKEN_STRIP = "\"“”‘’'()[],.;:!?«»"
_WORD_RE = re.compile(r"[^\W\d_]+(?:[’'\-][^\W\d_]+)*")
# TeX's logos come out of pdftotext in capitals (the small raised A, the lowered E).
_LOGOS = {"XELATEX": "XeLaTeX", "LUALATEX": "LuaLaTeX", "XETEX": "XeTeX", "BIBTEX": "BibTeX",
          "LATEX": "LaTeX", "TEX": "TeX"}
_LOGO_RE = re.compile(r"(?<![A-Z])(" + "|".join(_LOGOS) + r")(?![A-Z])")
_LIGATURES = str.maketrans({"ﬀ": "ff", "ﬁ": "fi", "ﬂ": "fl", "ﬃ": "ffi", "ﬄ": "ffl",
                            "ﬅ": "st", "ﬆ": "st", "\u00ad": ""})

# English function words that are not also common words of German, French, Italian, Spanish,
# Dutch or Polish ("in", "an", "a", "die", "was", "so", "on" are left out on purpose).
_ENGLISH = frozenset(str.split(
    "the of and to is that for it with be are this by or not can which you if from at will "
    "has have its these there when than they their should would been into but such only other "
    "more how what where must may also any each"))
# Function words of German, French, Italian, Spanish, Dutch, Portuguese and Polish that are
# neither English words nor common in English manuals ("de", "la", "et", "aux", "do" are).
_FOREIGN = frozenset(str.split(
    "der und ist nicht mit für ein eine einen wird werden sich auf den dem zu von wenn oder "
    "auch kann sind bei wie nach aus noch nur diese dieser wir man dass daß "
    "le les des est une pour dans qui que sur pas ne avec sont ce cette au du nous vous "
    "peut être ou il di che è della delle del una sono con questo gli nel alla "
    "el los las es por para como het een niet voor zijn wordt não em um uma com "
    "jest się nie oraz dla jak że lub"))


@dataclass
class PdfStats:
    """What became of the PDFs of one :func:`pdf_documents` run, filled in as it goes."""

    read: int = 0  # converted by pdftotext
    no_prose: int = 0  # converted, but no paragraph passed the prose rules
    failed: list[str] = field(default_factory=list)  # relative paths
    timed_out: list[str] = field(default_factory=list)
    not_english: list[str] = field(default_factory=list)


def pdf_documents(source: str, root: Path, package: str, stats: PdfStats | None = None, *,
                  timeout_s: float = TIMEOUT_S, workers: int = WORKERS) -> Iterator[Document]:
    """One document per PDF under ``root`` with English prose, in sorted path order.

    A PDF that pdftotext fails on, or that takes longer than ``timeout_s``, is skipped and
    listed in ``stats`` (pass one to read it after the run), as is a document left out as
    not English. A missing pdftotext is reported here, before any file is read.
    """
    program = shutil.which("pdftotext")
    if program is None:
        raise ElmoUserError("pdftotext is not installed and PDF sources need it: run "
                            "`apt-get install poppler-utils`, or leave the source out with "
                            "--sources")
    paths = sorted(root.rglob("*.pdf"), key=lambda path: path.relative_to(root).as_posix())
    stats = stats if stats is not None else PdfStats()
    return _documents(source, root, package, paths, program, stats, timeout_s, workers)


def _documents(source: str, root: Path, package: str, paths: list[Path], program: str,
               stats: PdfStats, timeout_s: float, workers: int) -> Iterator[Document]:
    # Conversions run a few files ahead of the consumer and are read in path order, so the
    # output does not depend on the threads' timing.
    pending: deque[tuple[Path, Future[tuple[str, str, str]]]] = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for path in paths:
                pending.append((path, pool.submit(_pdftotext, program, path, timeout_s)))
                if len(pending) >= 2 * workers:
                    yield from _document(source, root, package, stats, *pending.popleft())
            while pending:
                yield from _document(source, root, package, stats, *pending.popleft())
        finally:
            for _, future in pending:
                future.cancel()


def _pdftotext(program: str, path: Path, timeout_s: float) -> tuple[str, str, str]:
    """(outcome, title, text) with outcome one of ok, failed, timed_out."""
    try:
        result = subprocess.run([program, "-enc", "UTF-8", "-htmlmeta", str(path), "-"],
                                capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timed_out", "", ""
    output = result.stdout.decode("utf-8", errors="replace")
    start, end = output.find(_BODY_START), output.rfind(_BODY_END)
    if result.returncode != 0 or start < 0 or end < start:
        return "failed", "", ""
    title = _TITLE_RE.search(output, 0, start)
    title_text = " ".join(html.unescape(title.group(1)).split()) if title else ""
    return "ok", title_text, output[start + len(_BODY_START):end]


def _document(source: str, root: Path, package: str, stats: PdfStats, path: Path,
              future: Future[tuple[str, str, str]]) -> Iterator[Document]:
    outcome, title, text = future.result()
    relative = path.relative_to(root).as_posix()
    if outcome != "ok":
        (stats.timed_out if outcome == "timed_out" else stats.failed).append(relative)
        return
    stats.read += 1
    paragraphs = prose_paragraphs(text)
    if not paragraphs:
        stats.no_prose += 1
        return
    english = english_paragraphs(paragraphs) if is_english(paragraphs) else ()
    if not english:
        stats.not_english.append(relative)
        return
    meta = {"package": package, "path": relative}
    if title:
        meta["title"] = title
    yield Document(source, f"{source}/{relative}", english, meta)


def prose_paragraphs(text: str) -> tuple[str, ...]:
    """The prose paragraphs of one PDF's pdftotext text (pages ended by form feeds), in
    reading order, whatever their language."""
    text = _LOGO_RE.sub(lambda match: _LOGOS[match.group(1)], text.translate(_LIGATURES))
    body = _join_pages(text)
    vocabulary = {token.strip(_TOKEN_STRIP) for token in body.split()}
    paragraphs = (_tidy(_join_lines(lines, vocabulary))
                  for block in _BLOCK_BREAK_RE.split(body)
                  for lines in _split_block(block))
    return clean_paragraphs([p for p in paragraphs if is_prose(p)])


def is_prose(paragraph: str) -> bool:
    """Whether a joined paragraph reads as running prose (the rules at the top)."""
    tokens = paragraph.split()
    if not tokens:
        return False
    # Headings, captions and contents entries do not end a sentence.
    if not _SENTENCE_END_RE.search(paragraph):
        return False
    # A short one starting in lowercase is a sentence's tail, cut off by a display or a note.
    if paragraph[0].islower() and len(tokens) < MIN_TAIL_WORDS:
        return False
    # Contents lists and indexes have dot leaders; bibliographies start with a key.
    if _LEADER_RE.search(paragraph) or _REFERENCE_RE.match(paragraph):
        return False
    bare = [token.strip(_TOKEN_STRIP) for token in tokens]
    n = len(tokens)
    words = sum(1 for token in bare if _WORD_RE.fullmatch(token))
    code = sum(1 for token in tokens if _CODE_CHARS.intersection(token))
    single = sum(1 for token in bare if len(token) == 1 and token.isalpha()
                 and token not in "aAI")
    distinct = len({token.lower() for token in bare})
    return (words >= MIN_WORD_SHARE * n and code <= MAX_CODE_SHARE * n
            and single <= MAX_SINGLE_LETTER_SHARE * n
            and (n < 20 or distinct >= MIN_DISTINCT_SHARE * n))


def is_english(paragraphs: Sequence[str]) -> bool:
    """Whether a document, given its prose paragraphs, is English (MIN_ENGLISH_SHARE)."""
    english = foreign = words = 0
    for paragraph in paragraphs:
        counts = _function_words(paragraph)
        english, foreign, words = english + counts[0], foreign + counts[1], words + counts[2]
    return english >= MIN_ENGLISH_SHARE * words and english > foreign


def english_paragraphs(paragraphs: Sequence[str]) -> tuple[str, ...]:
    """The English paragraphs of an English document: bilingual manuals alternate English
    with German or French paragraphs, and sample documents hold lorem ipsum, which has no
    English function word at all."""
    kept = []
    for paragraph in paragraphs:
        english, foreign, _ = _function_words(paragraph)
        if english > foreign:
            kept.append(paragraph)
    return tuple(kept)


def _function_words(paragraph: str) -> tuple[int, int, int]:
    """(English function words, other languages' function words, words)."""
    words = [token.strip(_TOKEN_STRIP).lower() for token in paragraph.split()]
    english = sum(1 for word in words if word in _ENGLISH)
    return english, sum(1 for word in words if word in _FOREIGN), len(words)


def _join_pages(text: str) -> str:
    """The text without running heads, footers and page numbers, and with a paragraph that
    runs over a page break in one block again: the page before stops mid-sentence and this
    one goes on in lowercase, once the footnotes at the foot of the one and the margin notes
    at the head of the other are out of the way."""
    pages = [page.split("\n") for page in text.split("\f")]
    running = _running_lines([[line for line in page if line.strip()] for page in pages])
    joined: list[str] = []
    notes: list[str] = []  # footnotes of the page before, after the paragraph they cut
    for page in pages:
        lines = [line.strip() for line in _strip_running(page, running)]
        if not lines:
            continue
        start = _body_start(lines)
        if joined and not _ends_sentence(joined) and lines[start][:1].islower():
            lines = lines[start:]
        else:
            joined.extend(["", *notes, ""] if notes else [""])
            notes = []
        cut = _footnotes_start(lines)
        notes.extend(lines[cut:])
        joined.extend(lines[:cut])
    joined.extend(["", *notes])
    return "\n".join(joined)


def _ends_sentence(lines: list[str]) -> bool:
    last = next((line for line in reversed(lines) if line), "")
    return bool(_SENTENCE_END_RE.search(last))


def _body_start(lines: list[str]) -> int:
    """The first line past a page's margin notes (macro names, one-word labels)."""
    for index, line in enumerate(lines):
        if line and not _is_code_line(line) and len(line.split()) > 1:
            return index
    return 0


def _footnotes_start(lines: list[str]) -> int:
    """Where the footnotes at a page's foot start, if its text runs on past them: the last
    of its last ten lines with a footnote mark, after a line that ends no sentence."""
    for index in range(len(lines) - 1, max(len(lines) - 10, 1) - 1, -1):
        if _FOOTNOTE_RE.match(lines[index]) and not _ends_sentence(lines[:index]):
            return index
    return len(lines)


def _running_lines(pages: list[list[str]]) -> set[str]:
    """Lines (digits aside) among the first or last two of three pages or more."""
    edges: Counter[str] = Counter()
    for lines in pages:
        edges.update({_digitless(line) for line in lines[:2] + lines[-2:]})
    return {line for line, count in edges.items() if count >= 3}


def _digitless(line: str) -> str:
    return re.sub(r"\d+", "#", line.strip())


def _strip_running(lines: list[str], running: set[str]) -> list[str]:
    start, end = 0, len(lines)
    while start < end and (not lines[start].strip() or _digitless(lines[start]) in running):
        start += 1
    while end > start and (not lines[end - 1].strip()
                           or _digitless(lines[end - 1]) in running):
        end -= 1
    return lines[start:end]


def _split_block(block: str) -> Iterator[list[str]]:
    """A block's lines in paragraphs: a code line ends one and goes, a footnote or list
    item starts one, and a short line ends one (see _split_short)."""
    run: list[str] = []
    for line in block.split("\n"):
        line = line.strip()
        if not line:
            continue
        code = _is_code_line(line)
        if code or _FOOTNOTE_RE.match(line) or _BULLET_RE.match(line):
            yield from _split_short(run)
            run = []
        if not code:
            run.append(line)
    yield from _split_short(run)


def _is_code_line(line: str) -> bool:
    if _LISTING_LINE_RE.match(line):
        return True
    tokens = line.split()
    code = sum(1 for token in tokens if _CODE_CHARS.intersection(token))
    return code * 2 >= len(tokens)


def _split_short(run: list[str]) -> Iterator[list[str]]:
    """pdftotext leaves no blank line between the paragraphs of a column, nor around its
    headings; only a paragraph's last line, or a heading, stops well short of the margin."""
    if len(run) < 2:
        if run:
            yield run
        return
    short = SHORT_LINE * statistics.median(len(line) for line in run)
    start = 0
    for index, line in enumerate(run):
        if len(line) < short and not line.endswith("-"):
            # One that follows a sentence's end without ending one is a heading.
            if (index > start and _SENTENCE_END_RE.search(run[index - 1])
                    and not _SENTENCE_END_RE.search(line)):
                yield run[start:index]
                start = index
            yield run[start:index + 1]
            start = index + 1
    if start < len(run):
        yield run[start:]


def _join_lines(lines: list[str], vocabulary: set[str]) -> str:
    """One paragraph's lines as one line, words hyphenated at a line end whole again (but
    "user-" + "defined" stays "user-defined" where the document writes it so elsewhere)."""
    parts: list[str] = []
    for line in lines:
        head = _HYPHEN_END_RE.search(parts[-1]) if parts else None
        if head is None:
            parts.append(line)
            continue
        tail = line.split(maxsplit=1)[0].strip(_TOKEN_STRIP)
        # Only a lowercase word goes on a hyphenated one; "X-" + "Window" is a compound.
        compound = not line[:1].islower() or (f"{head.group(1)}-{tail}" in vocabulary
                                              and f"{head.group(1)}{tail}" not in vocabulary)
        parts[-1] = parts[-1] + line if compound else parts[-1][:-1] + line
    return " ".join(parts)


def _tidy(paragraph: str) -> str:
    """Without a list bullet or footnote mark before it and symbol glyphs after it, and
    without an unfinished last sentence: a display (code, an equation) or a note cut it."""
    paragraph = _TRAILING_SYMBOLS_RE.sub("", _LEADING_MARK_RE.sub("", paragraph))
    if _SENTENCE_END_RE.search(paragraph):
        return paragraph
    ends = list(_INNER_END_RE.finditer(paragraph))
    return paragraph[:ends[-1].end()] if ends else paragraph
