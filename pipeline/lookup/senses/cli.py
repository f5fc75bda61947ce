"""``elmo senses search`` and ``elmo senses cluster``: registered by ``cli.register``.

Imports nothing heavy at module level; each handler imports what it needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from elmo_model.errors import cli_flag

# Characters of a hit's sentence shown around the word, on one line (a corpus's "sentence"
# may be a whole multi-line HTML page).
SNIPPET_CHARS = 110

SENSES_EPILOG = """\
Both verbs read an index built by `elmo index build` (--index, or $ELMO_INDEX); it
remembers its dataset and mix.

Both show each occurrence's document fields (source, and the extra JSON Lines fields
such as year or president) and take --where to keep only some documents.

examples:
  elmo senses search "He plays the guitar in a band" --word plays --index data/ds-top.lance
  elmo senses cluster play --index data/ds-top.lance --plot play.png --html play.html
  elmo senses cluster union --where year=1900..1999 --by year --bin 10
"""

SENSES_SEARCH_EPILOG = """\
The query sentence is split with the dataset's tokenizer and embedded with the dataset's
own model (or --model DIR, checked by fingerprint), then mixed like the index. By default
only occurrences of the same word count, in any of its forms (plays finds play, played,
playing: Snowball stems); --same-form keeps only the word as written (any case),
--any-word searches every token. A context found twice (the same sentence around the same
word) is listed once. Each result shows its document's fields (--fields picks which).

--where keeps only occurrences in documents whose fields pass (repeatable; all must pass):
  FIELD=VALUE   FIELD!=VALUE   FIELD>=N (also <=, >, <)   FIELD=LO..HI (range, ends included)
  FIELD=A|B (any of)   FIELD~TEXT (contains, any case)
FIELD is doc_id, source, line or a field of the documents' metadata (JSON Lines fields).

--ray-address spreads a compact index's shards over Ray actors (one per node, or
--ray-actors N), each holding only its shards; the hits are those of one process
(docs/index_sizing.md: how to size a cluster).

examples:
  elmo senses search "He plays the guitar in a band" --word plays --index data/ds-top.lance
  elmo senses search "She sat on the bank of the river" --word bank -k 20
  elmo senses search "He plays the guitar in a band" --word plays --any-word
  elmo senses search "The play was a success" --word play --same-form --exact
  elmo senses search "The Union must be preserved" --word Union --where year=1850..1870
  elmo senses search "The Union must be preserved" --word Union --where "president~lincoln"
  elmo senses search "She sat on the bank" --word bank --index s3://b/ix --ray-address auto
"""

SENSES_CLUSTER_EPILOG = """\
Clusters the mixed vectors of every distinct context of the word(s) with k-means (cosine
geometry, centred on the uses' mean); --k auto takes the largest k in 2..8 whose
silhouette is near the best (measured against gold senses: docs/senses.md).
First each written form is centred on
its word (--centre case: Union, UNION and union share one mean, so capitals alone do not
make a sense; --centre forms: every form, plural too; --centre none: as stored). Each
sense is named by its most typical neighbour phrases and context words, with the examples
nearest its centre. --plot writes a PNG map (PCA, one colour per sense, legend), --html an
interactive map (open it in a browser, hover a dot to read its sentence; plotly.js is
inside the file, no network).

--where keeps only some documents (syntax as in `elmo senses search --help`); --by FIELD
counts each sense per value of a document field (--bin N groups numbers: --by year --bin
10 counts per decade); --out FILE.parquet writes every occurrence with its sense (doc_id,
sent_idx, tok_idx, token, cluster, sense, similarity, sentence, start, end, then the
document's fields).

examples:
  elmo senses cluster play --index data/ds-top.lance --plot play.png --html play.html
  elmo senses cluster play plays played --k 3
  elmo senses cluster kind --examples 5
  elmo senses cluster union --by year --bin 10 --out union.parquet
  elmo senses cluster union --where year=1945..1991 --by president --centre none
"""


# The library's settings whose flags differ from ``cli_flag``'s rule (library errors name
# the setting; ``pipeline/cli.py`` prints the verb's flag). ``max_k`` has no flag.
SEARCH_FLAGS = {"k": "-k", "model_dir": "--model"}
CLUSTER_FLAGS = {"max_k": "max_k"}


def search_flag(setting: str) -> str:
    return SEARCH_FLAGS.get(setting) or cli_flag(setting)


def cluster_flag(setting: str) -> str:
    return CLUSTER_FLAGS.get(setting) or cli_flag(setting)


def register_senses(subparsers: Any, add: Callable[..., Any],
                    show_help: Callable[[argparse.ArgumentParser], int]) -> None:
    """The ``senses`` verbs, made with ``cli``'s parser helpers (``add``, ``show_help``)
    so that every verb is built alike."""
    senses = add(subparsers, "senses", "contextual word senses: search, cluster, change, label",
                  SENSES_EPILOG)
    sv = senses.add_subparsers(dest="senses_command", metavar="VERB")
    s = add(sv, "search", "occurrences nearest to a word as used in a sentence",
             SENSES_SEARCH_EPILOG)
    s.add_argument("sentence", metavar="SENTENCE", help="a sentence using the word")
    s.add_argument("--word", required=True, help="the word of SENTENCE to look up")
    s.add_argument("-k", type=int, default=10, help="neighbours to show (default 10)")
    which = s.add_mutually_exclusive_group()
    which.add_argument("--any-word", dest="match", action="store_const", const="any",
                       help="neighbours among every token, whatever its word (default: "
                            "only WORD, in any of its forms)")
    which.add_argument("--same-form", dest="match", action="store_const", const="word",
                       help="only WORD as written (any case), not its other forms")
    # The default since word forms were indexed; kept so that older scripts still run.
    which.add_argument("--same-word", dest="match", action="store_const", const="forms",
                       help=argparse.SUPPRESS)
    s.set_defaults(match="forms")
    s.add_argument("--occurrence", type=int, default=1,
                   help="which occurrence of --word in SENTENCE (default 1)")
    s.add_argument("--exact", action="store_true", help="exact search, bypassing the ANN index")
    _where_arg(s)
    s.add_argument("--fields", metavar="A,B", help="document fields to show, comma separated "
                   "(default: every metadata field; doc_id is always shown)")
    _index_args(s)
    s.add_argument("--model", metavar="DIR", help="model directory (default: the dataset's)")
    s.add_argument("--ray-address", metavar="ADDR",
                   help="search on Ray actors that each hold some of the index's shards: "
                        "auto (the running cluster), HOST:PORT, or local (a Ray started here)")
    s.add_argument("--ray-actors", type=int, metavar="N",
                   help="with --ray-address: actors to spread the shards over (default: one "
                        "per node)")
    s.set_defaults(handler=run_senses_search, setting_flag=search_flag)
    c = add(sv, "cluster", "group the occurrences of a word into senses, and map them",
             SENSES_CLUSTER_EPILOG)
    c.add_argument("words", nargs="+", metavar="WORD", help="word(s), matched in lowercase")
    c.add_argument("--k", default="auto", help="number of senses, or auto (2..8, by silhouette)")
    c.add_argument("--examples", type=int, default=3, help="sentences shown per sense (3)")
    c.add_argument("--plot", metavar="PNG", help="write the sense map as a PNG picture")
    c.add_argument("--html", metavar="HTML", help="write an interactive sense map (hover a "
                   "dot to read its sentence)")
    _where_arg(c)
    c.add_argument("--by", metavar="FIELD", help="count each sense per value of this "
                   "document field (year, president, source, ...)")
    c.add_argument("--bin", type=float, metavar="N", help="with --by on a number field: "
                   "group values in bins of N (--bin 10 on year: decades)")
    c.add_argument("--out", metavar="FILE", help="write every occurrence with its sense as "
                   "Parquet (FILE.parquet)")
    c.add_argument("--centre", choices=("case", "forms", "none"), default="case",
                   help="centre written forms before clustering: case (default: capitals "
                        "alone make no sense), forms (every form), none")
    _index_args(c)
    c.set_defaults(handler=run_senses_cluster, setting_flag=cluster_flag)
    from pipeline.lookup.senses.change_cli import add_change_parser

    add_change_parser(sv, add, _index_args, _where_arg)
    from pipeline.lookup.senses.label_cli import add_label_parser

    add_label_parser(sv, add, _index_args)
    senses.set_defaults(handler=lambda args: show_help(senses))



def _index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", default=os.environ.get("ELMO_INDEX"), metavar="URI",
                   help="index built by `elmo index build` (default $ELMO_INDEX)")


def _need_index(args: argparse.Namespace) -> str:
    from elmo_model.errors import ElmoUserError

    if not args.index:
        raise ElmoUserError("which index? pass --index URI (or set ELMO_INDEX)")
    return str(args.index)


def _where_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--where", action="append", default=[], metavar="COND",
                   help="only documents whose fields pass, e.g. year>=1900, year=1900..1950, "
                        "president=Abraham Lincoln, president~lincoln (repeatable)")


def _where(items: list[str]) -> list[Any]:
    from pipeline.lookup.doc_fields import parse_where

    return [f for item in items for f in parse_where(item)]


def _highlight() -> tuple[str, str]:
    return ("\033[1;31m", "\033[0m") if sys.stdout.isatty() else ("[", "]")


def run_senses_search(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.lookup.senses.query_model import ModelProcess

    if args.ray_actors is not None and not args.ray_address:
        raise ElmoUserError("--ray-actors needs --ray-address (auto, HOST:PORT or local)")
    uri = str(_need_index(args))
    # The model's process starts first (torch imports there meanwhile); this one imports
    # the index's modules, opens it and names the model's files to load.
    with ModelProcess() as model:
        from pipeline.lookup.index.sense_index import SenseIndex
        from pipeline.lookup.senses.search import check_search, model_files_for, search_senses

        check_search(args.k, args.match)
        index = SenseIndex(uri)
        model.load(*model_files_for(index.dataset_descriptor(), args.model))
        if args.ray_address:
            from pipeline.lookup.index.ivf_ray import scatter

            scatter(index, args.ray_address, args.ray_actors)
        hits = search_senses(index, args.sentence, args.word, k=args.k,
                             match=args.match, occurrence=args.occurrence,
                             embedder=model, exact=args.exact, filters=_where(args.where))
    left, right = _highlight()
    names = [n.strip() for n in args.fields.split(",") if n.strip()] if args.fields else None
    for h in hits:
        fields = h.field_text(names)
        print(f"{h.rank:>3}  {h.similarity:6.3f}  {h.doc_id}#{h.sent_idx}.{h.tok_idx}  "
              f"{f'({fields})  ' if fields else ''}{h.snippet(SNIPPET_CHARS, left, right)}")
    among = {"forms": f"uses of {args.word!r} in any of its forms (--same-form: this form "
                      "only; --any-word: every word)",
             "word": f"uses of {args.word!r} as written, any case",
             "any": "every word"}[args.match]
    sys.stdout.flush()  # the note after the results, also when both go to one pipe
    where = f" in documents with {' '.join(args.where)}" if args.where else ""
    print(f"{len(hits) or 'no'} nearest among {among}{where}; repeated contexts shown once",
          file=sys.stderr)
    return 0


def run_senses_cluster(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.lookup.senses.clusters import AUTO_SILHOUETTE_SHARE, cluster_senses
    from pipeline.lookup.senses.maps import (
        check_writable,
        occurrence_count,
        write_sense_map_html,
        write_sense_map_png,
    )
    from pipeline.lookup.senses.tables import breakdown_of, write_assignments

    for path in (args.plot, args.html, args.out):
        if path:
            check_writable(path)
    if args.bin is not None and not args.by:
        raise ElmoUserError("--bin groups the values of --by FIELD; add --by (e.g. --by year)")
    from pipeline.lookup.senses.clusters import sense_count

    k = sense_count(args.k)
    result = cluster_senses(_need_index(args), args.words, k=k, examples=args.examples,
                            filters=_where(args.where), centre=args.centre)
    # Before anything prints: a wrong --by is a user error, not half an answer.
    breakdown = breakdown_of(result, args.by, args.bin) if args.by else None
    left, right = _highlight()
    where = f" in documents with {' '.join(result.filters)}" if result.filters else ""
    print(f"{' / '.join(result.words)}: {occurrence_count(result)}{where}, mix {result.mix}, "
          f"forms centred: {result.centre}")
    if result.auto:
        scores = ", ".join(f"k={kk}: {s:.3f}" for kk, s in result.silhouettes.items())
        print(f"k = {result.k}: the largest within {AUTO_SILHOUETTE_SHARE:.0%} of the best "
              f"silhouette ({scores})")
    for c in result.clusters:
        print(c.name())
        for h in c.examples:
            fields = h.field_text()
            print(f"    {h.doc_id}#{h.sent_idx}  {f'({fields})  ' if fields else ''}"
                  f"{h.snippet(SNIPPET_CHARS, left, right)}")
    if breakdown is not None:
        print("\n".join(breakdown_lines(breakdown)))
    sys.stdout.flush()  # the notes below after the results, also when both go to one pipe
    if args.out:
        print(f"wrote {write_assignments(result, args.out)} (every occurrence with its "
              "sense)", file=sys.stderr)
    if args.plot:
        print(f"wrote {write_sense_map_png(result, args.plot)} (sense map picture)",
              file=sys.stderr)
    if args.html:
        print(f"wrote {write_sense_map_html(result, args.html)} (interactive sense map: open "
              "it in a browser)", file=sys.stderr)
    return 0


def breakdown_lines(breakdown: Any) -> list[str]:
    """The breakdown as a text table: a row per value, occurrences per sense and share."""
    heads = [f"sense {i + 1}" for i in range(len(breakdown.senses))]
    first = max([len(breakdown.by), *(len(r.value) for r in breakdown.rows)])
    width = max(12, *(len(h) for h in heads))
    lines = [f"\noccurrences by {breakdown.by}"
             f"{f' (bins of {breakdown.bin:g})' if breakdown.bin else ''}:",
             "  ".join([breakdown.by.ljust(first), "contexts".rjust(8),
                        *(h.rjust(width) for h in heads)])]
    for row in breakdown.rows:
        cells = [f"{c} ({s:.0%})".rjust(width) for c, s in zip(row.counts, row.shares(),
                                                                strict=True)]
        lines.append("  ".join([row.value.ljust(first), str(row.total).rjust(8), *cells]))
    return lines
