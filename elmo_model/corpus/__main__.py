"""``python -m elmo_model.corpus build --out DIR``: fetch, clean, dedup, split, write."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from elmo_model.corpus.build import SPLITS, build_corpus
from elmo_model.corpus.sources import SOURCE_NAMES, fetch, source_named
from elmo_model.corpus.split import DEFAULT_HELDOUT_PERCENT
from elmo_model.errors import ElmoUserError

# The plain-text corpus the bundled model trained on, beside the repository when present.
DEFAULT_CLASSICS = Path(__file__).resolve().parents[2].parent / "shared" / "corpora"

EXAMPLES = f"""\
examples:
  python -m elmo_model.corpus build --out /tmp/corpus
  python -m elmo_model.corpus build --out /tmp/sotu --sources sotu,wikipedia
  python -m elmo_model.corpus build --out /tmp/corpus --classics /data/corpora --work /tmp/dl
  python -m elmo_model.corpus build --out /tmp/v5 --sources {",".join(SOURCE_NAMES[:6])}

The last example builds the six sources the bundled model (version 5) trained on.
latex-docs reads PDFs with pdftotext (`apt-get install poppler-utils`).

sources, read in this order (the first copy of a paragraph is kept): {', '.join(SOURCE_NAMES)}
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m elmo_model.corpus",
                                     description="Build the training corpus recipe.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser(
        "build", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Fetch the sources with npm, pip and apt-get, keep their prose, drop "
                    "near-duplicate paragraphs, hold out documents by content hash, and "
                    "write OUT/train/*.jsonl, OUT/heldout/*.jsonl and OUT/manifest.json.")
    build.add_argument("--out", required=True, type=Path, help="output directory")
    build.add_argument("--sources", default=",".join(SOURCE_NAMES),
                       help="comma-separated source names (default: all)")
    build.add_argument("--classics", type=Path, default=DEFAULT_CLASSICS,
                       help="directory of the plain-text corpus, one paragraph a line "
                            "(default: ../shared/corpora beside the repository)")
    build.add_argument("--work", type=Path, default=None,
                       help="where packages are downloaded and unpacked (default: OUT/work); "
                            "a package already there is reused")
    build.add_argument("--heldout-percent", type=float, default=DEFAULT_HELDOUT_PERCENT,
                       help="percent of each source's documents held out (default: 1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        names = [name.strip() for name in args.sources.split(",") if name.strip()]
        sources = [source_named(name) for name in names]
        sources.sort(key=lambda source: SOURCE_NAMES.index(source.name))
        work = args.work or args.out / "work"
        started = time.monotonic()
        fetched = []
        for source in sources:
            fetched.append((source, fetch(source, work, args.classics)))
            print(f"fetched {source.name} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        manifest = build_corpus(args.out, fetched, args.heldout_percent)
    except ElmoUserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{'source':<16} {'documents':>10} {'words':>12} {'held-out words':>15}")
    for entry in manifest["sources"]:
        documents = sum(entry["documents"][split] for split in SPLITS)
        words = sum(entry["words"][split] for split in SPLITS)
        print(f"{entry['name']:<16} {documents:>10,} {words:>12,} "
              f"{entry['words']['heldout']:>15,}")
    print(f"wrote {args.out} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
