"""Prose out of PDF manuals (elmo_model/corpus/pdf.py): the text-to-paragraph rules on
strings shaped like pdftotext's output of TeX Live manuals, and the real pdftotext on small
PDFs written here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from elmo_model.corpus.pdf import (
    PdfStats,
    english_paragraphs,
    is_english,
    is_prose,
    pdf_documents,
    prose_paragraphs,
)
from elmo_model.errors import ElmoUserError

needs_pdftotext = pytest.mark.skipif(shutil.which("pdftotext") is None,
                                     reason="pdftotext (poppler-utils) is not installed")

ENGLISH = ("The package provides a command that typesets a framed box around its argument. "
           "The width of the frame can be changed with an optional argument.")
GERMAN = ("Das Paket stellt einen Befehl zur Verfügung, mit dem man einen Rahmen um den Text "
          "setzen kann. Die Breite des Rahmens wird mit einem optionalen Argument eingestellt, "
          "wenn man das möchte, und ist sonst so breit wie der Text.")


def test_lines_join_and_hyphenated_words_are_whole_again() -> None:
    text = ("The indenta-\ntion of a para-\ngraph comes from a user-\ndefined length, and "
            "a user-defined\nlength can be set in the preamble. The X-\nWindow driver is "
            "not needed here.\n")
    assert prose_paragraphs(text) == (
        "The indentation of a paragraph comes from a user-defined length, and a user-defined "
        "length can be set in the preamble. The X-Window driver is not needed here.",)


def test_contents_index_and_references_go() -> None:
    text = """Contents
1 Introduction . . . . . . . . . . . . . . . . . . . . . . 2
1.1 Basic idea . . . . . . . . . . . . . . . . . . . . . . 4

2 Interface for programmers ...................... 5

\\zref@newlist . . . . . . 12, 14, 20 \\zref@newprop . . 8, 9

[1] Leslie Lamport. LaTeX: A Document Preparation System. Addison-Wesley, 1994.

[Knu84] Donald E. Knuth. The TeXbook. Addison-Wesley, Reading, Massachusetts, 1984.

""" + ENGLISH + "\n"
    assert prose_paragraphs(text) == (ENGLISH,)


def test_code_lines_cut_paragraphs_and_go() -> None:
    # The sentence that leads into the listing is unfinished without it, so it goes too.
    text = ("We need a counter similar to the footnote counter, set to one at the start. It\n"
            "is defined with the two commands below, which the package runs when it is\n"
            "8 \\newcounter{sidenote} % make a counter\n"
            "9 \\setcounter{sidenote}{1}\n"
            "10\n"
            "\\def\\x{\\endgroup\\let\\y\\z}%\n"
            "Then the command is defined with two optional arguments and a mandatory one.\n")
    assert prose_paragraphs(text) == (
        "We need a counter similar to the footnote counter, set to one at the start.",
        "Then the command is defined with two optional arguments and a mandatory one.")


def test_inline_macros_stay_but_macro_lists_and_math_go() -> None:
    inline = ("The \\sidecaption macro can be used if the caption of a figure or table "
              "should be in the margin.")
    macros = r"\zref@label, \zref@labelbylist, \zref@labelbyprops and \zref@newlabel."
    math = "Let f(x) = a x + b y + c z for x, y, z in R and a, b, c > 0."
    table = "Name Size Weight 12pt 10.5 11 4.2 3 7 1.5 2 8."
    assert is_prose(inline)
    assert not is_prose(macros)
    assert not is_prose(math)
    assert not is_prose(table)
    assert not is_prose("Implementation of the package options")  # a heading: no full stop
    assert not is_prose("is set at the start.")  # a sentence's tail cut off by a display


def test_short_lines_end_paragraphs_in_a_column() -> None:
    # A column of a two-column page: no blank line between its paragraphs and headings.
    text = """The filecontents environment warns on the terminal
if a file gets overwritten even if that is intentional,
as when you write a file over and over again.
2.3 Shipout hooks
Since October 2020 the shipout process offers a
number of hooks to adjust what is happening before,
during, and after the shipout of a page.
"""
    assert prose_paragraphs(text) == (
        "The filecontents environment warns on the terminal if a file gets overwritten even "
        "if that is intentional, as when you write a file over and over again.",
        "Since October 2020 the shipout process offers a number of hooks to adjust what is "
        "happening before, during, and after the shipout of a page.")


def test_running_heads_go_and_a_paragraph_goes_on_over_a_page_break() -> None:
    page = "The zref package\n\n{body}\n\n{number}\n"
    pages = [
        page.format(body="The references are written to the auxiliary file when the page\n"
                         "is shipped out, so that the next run of the document can\n"
                         "∗ Please report any issues at the project's issue tracker.",
                    number=1),
        page.format(body="\\zref@newlabel\n\n"
                         "read them back and print them where they are wanted.", number=2),
        page.format(body=ENGLISH, number=3),
    ]
    assert prose_paragraphs("\f".join(pages)) == (
        "The references are written to the auxiliary file when the page is shipped out, so "
        "that the next run of the document can read them back and print them where they "
        "are wanted.",
        "Please report any issues at the project's issue tracker.",
        ENGLISH)


def test_logos_ligatures_bullets() -> None:
    text = ("• LATEX and pdfTEX read the conﬁguration ﬁle ﬁrst, and BIBTEX reads it\n"
            "when the bibliography is built.\n")
    assert prose_paragraphs(text) == (
        "LaTeX and pdfTeX read the configuration file first, and BibTeX reads it when the "
        "bibliography is built.",)


def test_german_documents_and_paragraphs_go() -> None:
    german = prose_paragraphs(GERMAN + "\n\n" + GERMAN.replace("Paket", "Modul") + "\n")
    assert len(german) == 2
    assert not is_english(german)
    lorem = ("Lorem ipsum dolor sit amet, consectetuer adipiscing elit. Ut purus elit, "
             "vestibulum ut, placerat ac, adipiscing vitae, felis.")
    bilingual = [ENGLISH, GERMAN, lorem, ENGLISH.replace("frame", "border")]
    assert is_english(bilingual)
    assert english_paragraphs(bilingual) == (ENGLISH, ENGLISH.replace("frame", "border"))


def _pdf(pages: list[list[str]], title: str = "") -> bytes:
    """A PDF of letter pages, each line a Helvetica text object; a line "" is a gap."""
    objects = {1: b"<< /Type /Catalog /Pages 2 0 R >>",
               3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"}
    page_ids = [4 + 2 * index for index in range(len(pages))]
    kids = " ".join(f"{number} 0 R" for number in page_ids)
    objects[2] = f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode()
    for number, lines in zip(page_ids, pages, strict=True):
        shown = []
        for index, line in enumerate(lines):
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            if line:
                shown.append(f"BT /F1 11 Tf 72 {740 - 14 * index} Td ({escaped}) Tj ET")
        stream = "\n".join(shown).encode("latin-1")
        objects[number] = (f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                           f"/Resources << /Font << /F1 3 0 R >> >> "
                           f"/Contents {number + 1} 0 R >>").encode()
        objects[number + 1] = (b"<< /Length %d >>\nstream\n" % len(stream) + stream
                               + b"\nendstream")
    info = ""
    if title:
        objects[max(objects) + 1] = f"<< /Title ({title}) >>".encode("latin-1")
        info = f" /Info {max(objects)} 0 R"
    out = bytearray(b"%PDF-1.4\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + objects[number] + b"\nendobj\n"
    xref = len(out)
    size = max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    out += b"".join(b"%010d 00000 n \n" % offsets[number] for number in range(1, size))
    out += f"trailer\n<< /Size {size} /Root 1 0 R{info} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


MANUAL = [
    ["Sample Manual", "",
     "This package typesets the examples of a manual in a frame and",
     "keeps them on one page when it can. The frame is drawn with rules",
     "that follow the text width.",
     "\\begin{frame}{An example} % a code line",
     "When the example is longer than the page, the frame is split and",
     "each part gets its own rules, so that the reader sees where it",
     "", "", "", "1"],
    ["Sample Manual", "",
     "continues on the next page without a break in the middle of the",
     "sentence, which the reader should not notice at all.",
     "", "", "", "2"],
    ["Sample Manual", "", "Contents . . . . . . . . . . . . . . . . . . 1", "", "", "", "3"],
]


@needs_pdftotext
def test_pdf_documents_reads_real_pdfs(tmp_path: Path) -> None:
    (tmp_path / "doc" / "frame").mkdir(parents=True)
    (tmp_path / "doc" / "frame" / "frame.pdf").write_bytes(_pdf(MANUAL, "The (frame) package"))
    german = [GERMAN[i:i + 60] for i in range(0, len(GERMAN), 60)]
    (tmp_path / "doc" / "frame" / "frame-de.pdf").write_bytes(_pdf([german]))
    (tmp_path / "doc" / "broken.pdf").write_bytes(b"%PDF-1.4\nnot a PDF at all\n")
    (tmp_path / "doc" / "empty.pdf").write_bytes(_pdf([["", "7"]]))

    stats = PdfStats()
    documents = list(pdf_documents("latex-docs", tmp_path, "texlive-latex-extra-doc", stats))
    assert [d.doc_id for d in documents] == ["latex-docs/doc/frame/frame.pdf"]
    assert documents[0].source == "latex-docs"
    assert documents[0].meta == {"package": "texlive-latex-extra-doc",
                                 "path": "doc/frame/frame.pdf", "title": "The (frame) package"}
    assert documents[0].paragraphs == (
        "This package typesets the examples of a manual in a frame and keeps them on one page "
        "when it can. The frame is drawn with rules that follow the text width.",
        "When the example is longer than the page, the frame is split and each part gets its "
        "own rules, so that the reader sees where it continues on the next page without a "
        "break in the middle of the sentence, which the reader should not notice at all.")
    assert stats == PdfStats(read=3, no_prose=1, failed=["doc/broken.pdf"], timed_out=[],
                             not_english=["doc/frame/frame-de.pdf"])
    # The same bytes give the same documents, whatever the threads did.
    assert list(pdf_documents("latex-docs", tmp_path, "texlive-latex-extra-doc",
                              workers=1)) == documents


def test_a_slow_pdftotext_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in that hangs, as pdftotext does on some broken files.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pdftotext").write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 30\n")
    (bin_dir / "pdftotext").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    (tmp_path / "slow.pdf").write_bytes(b"%PDF-1.4\n")
    stats = PdfStats()
    assert list(pdf_documents("s", tmp_path, "p", stats, timeout_s=0.3)) == []
    assert stats.timed_out == ["slow.pdf"] and stats.read == 0


def test_missing_pdftotext_names_the_fix(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ElmoUserError, match=r"apt-get install poppler-utils.*--sources"):
        pdf_documents("s", tmp_path, "p")
