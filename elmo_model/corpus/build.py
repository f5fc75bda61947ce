"""Build the corpus: read each source's documents, drop near-duplicate paragraphs, split
held-out documents off by content hash, and write JSONL plus a manifest.

Layout of the output directory::

    train/SOURCE.jsonl     one document a line: id, source, text, meta
    heldout/SOURCE.jsonl   the same for the held-out documents
    manifest.json          per source: package, version, licences, artifact sha256,
                           documents, paragraphs and words kept; sha256 of every JSONL file
    near_duplicates.jsonl  the first near-duplicate paragraphs dropped in each source, with
                           the paragraph each matched, to check what the threshold removes

A document's text is its kept paragraphs joined by blank lines. Nothing in the output
depends on the time or the machine, so a rerun on the same artifacts writes the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from elmo_model.corpus.dedup import (
    NEAR_DUPLICATE_JACCARD,
    NUM_PERM,
    SHINGLE_WORDS,
    ParagraphDeduper,
)
from elmo_model.corpus.extract import MIN_PARAGRAPH_WORDS, Document, count_words
from elmo_model.corpus.sources import Fetched, Source, sha256_file
from elmo_model.corpus.split import is_heldout

# 2 (2026-11-26): seven more sources; the first six still give the same bytes as in 1.
RECIPE_VERSION = "2"
MANIFEST_FILE = "manifest.json"
SPLITS = ("train", "heldout")


@dataclass
class SourceTally:
    documents: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    words: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    documents_emptied: int = 0  # every paragraph was a duplicate


def _write_document(handle: IO[str], document: Document, text: str) -> None:
    record = {"id": document.doc_id, "source": document.source, "text": text,
              "meta": document.meta}
    handle.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")


def _build_source(out: Path, source: Source, fetched: Fetched, deduper: ParagraphDeduper,
                  heldout_percent: float) -> SourceTally:
    tally = SourceTally()
    handles = {split: (out / split / f"{source.name}.jsonl").open("w", encoding="utf-8")
               for split in SPLITS}
    try:
        for document in source.documents(source.name, fetched.root):
            kept = [p for p in document.paragraphs if deduper.keep(source.name, p)]
            if not kept:
                tally.documents_emptied += 1
                continue
            text = "\n\n".join(kept)
            split = "heldout" if is_heldout(text, heldout_percent) else "train"
            _write_document(handles[split], document, text)
            tally.documents[split] += 1
            tally.words[split] += count_words(text)
    finally:
        for handle in handles.values():
            handle.close()
    return tally


def _source_entry(source: Source, fetched: Fetched, tally: SourceTally,
                  deduper: ParagraphDeduper) -> dict[str, Any]:
    counts = deduper.counts.get(source.name)
    return {
        "name": source.name, "client": source.client, "package": source.package,
        "version": source.version, "package_license": source.package_license,
        "text_license": source.text_license,
        "artifacts": [asdict(a) for a in fetched.artifacts],
        "documents": tally.documents, "documents_all_duplicate": tally.documents_emptied,
        "words": tally.words,
        "paragraphs": asdict(counts) if counts else {"exact": 0, "near": 0, "kept": 0},
    }


def build_corpus(out: Path, fetched_sources: Iterable[tuple[Source, Fetched]],
                 heldout_percent: float) -> dict[str, Any]:
    """Write the corpus of ``fetched_sources`` (read in the order given: the first copy of a
    paragraph is the one kept) under ``out``; returns the manifest it wrote."""
    for split in SPLITS:
        (out / split).mkdir(parents=True, exist_ok=True)
        # A source left out of this build must not linger from an earlier one.
        for stale in (out / split).glob("*.jsonl"):
            stale.unlink()
    deduper = ParagraphDeduper()
    entries = []
    for source, fetched in fetched_sources:
        tally = _build_source(out, source, fetched, deduper, heldout_percent)
        entries.append(_source_entry(source, fetched, tally, deduper))
    with (out / "near_duplicates.jsonl").open("w", encoding="utf-8") as handle:
        for source_name, examples in deduper.near_examples.items():
            for dropped, matched in examples:
                handle.write(json.dumps({"source": source_name, "dropped": dropped,
                                         "matched": matched}, ensure_ascii=False) + "\n")
    files = sorted(p.relative_to(out).as_posix() for split in SPLITS
                   for p in (out / split).glob("*.jsonl"))
    manifest = {
        "recipe": "elmo_model.corpus", "recipe_version": RECIPE_VERSION,
        "heldout_percent": heldout_percent,
        "cleaning": {"min_paragraph_words": MIN_PARAGRAPH_WORDS},
        "dedup": {"jaccard": NEAR_DUPLICATE_JACCARD, "shingle_words": SHINGLE_WORDS,
                  "num_perm": NUM_PERM},
        "sources": entries,
        "files": {name: sha256_file(out / name) for name in files},
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    return manifest
