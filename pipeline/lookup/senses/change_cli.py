"""``elmo senses change``: words ranked by change across groups of documents, or with a
WORD, that word's senses per group. Registered by ``senses.cli.register_senses``; imports
nothing heavy at module level."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

SENSES_CHANGE_EPILOG = """\
Without WORD: every word with --min-uses uses in at least two groups of --by FIELD
(numbers grouped in bins of --bin N; text fields as they are), ranked by how differently
it is used across the groups, highest first. Words are the index's word forms, as search
matches them (plays, played, playing are one word).

Scores (all four on every row; --method picks the one ranked by):
  prt   cosine distance between the groups' mean vectors
  apd   average cosine distance between two uses from different groups
  jsd   Jensen-Shannon divergence between the groups' shares of the word's senses
  ed    energy distance: apd less the average distance between two uses of one group, so
        a word whose uses vary a lot (two steady senses) does not look changed
With more than two groups prt, apd and ed average every pair of groups.

A raw score is mostly noise for a word with few uses, so `change` is the score's distance
from its own distribution when the documents' groups are shuffled, in standard deviations
(p: the share of shuffles scoring as high); --score excess ranks by the score less that
distribution's mean instead (how much rather than how sure: a frequent word's small but
certain shift then ranks low). The interval is a 95% bootstrap interval of
the raw score. Both resample whole documents (in blocks), not uses, since the uses in one
document are not independent. Computed in one pass over the index's vectors.

With WORD: the word's senses (clusters, as `elmo senses cluster`) and the share of each
per group, as a table; --plot writes stacked bars (PNG), --html an interactive chart.

examples:
  elmo senses change --index data/sotu-top.lance --by year --bin 25 --top 20
  elmo senses change --index data/sotu-top.lance --by year --bin 25 --words union,state
  elmo senses change --by party --min-uses 50 --format json --out change.parquet
  elmo senses change union --by year --bin 25 --plot union.png --html union.html
"""


def add_change_parser(verbs: Any, add: Callable[..., Any],
                      index_args: Callable[[argparse.ArgumentParser], None],
                      where_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    from pipeline.lookup.senses.change_scores import (
        DEFAULT_METHOD,
        DEFAULT_MIN_USES,
        DEFAULT_SCORE,
        METHODS,
        SCORES,
    )

    c = add(verbs, "change", "words ranked by change across groups of documents, or one "
            "word's senses per group", SENSES_CHANGE_EPILOG)
    c.add_argument("word", nargs="?", metavar="WORD", help="show this word's senses per "
                   "group instead of ranking words")
    c.add_argument("--by", metavar="FIELD", required=True, help="document field whose values "
                   "(or bins) are the groups: year, president, source, ...")
    c.add_argument("--bin", type=float, metavar="N", help="group a number field in bins of "
                   "N (--by year --bin 25: quarter centuries)")
    which = c.add_mutually_exclusive_group()
    which.add_argument("--words", metavar="W,W", help="rank only these words (comma "
                       "separated; each must have --min-uses uses in two groups)")
    which.add_argument("--top", type=int, metavar="N", help="show the N words that changed "
                       "most (default: all)")
    c.add_argument("--min-uses", type=int, default=DEFAULT_MIN_USES, metavar="N",
                   help=f"uses a word needs in a group to count there (default "
                        f"{DEFAULT_MIN_USES})")
    c.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                   help=f"score that ranks the words (default {DEFAULT_METHOD}: best on "
                        "bench/senses_change.py, docs/senses.md)")
    c.add_argument("--score", choices=SCORES, default=DEFAULT_SCORE,
                   help="what change is: z (default: how sure, the distance from the "
                        "shuffled null in its standard deviations) or excess (how much: the "
                        "score less the null's mean)")
    c.add_argument("--format", choices=("table", "json"), default="table",
                   help="table (default) or json: one JSON object a line")
    c.add_argument("--out", metavar="FILE", help="also write the rows as Parquet "
                   "(FILE.parquet)")
    c.add_argument("--seed", type=int, default=0, help="seed of the shuffles and draws (0)")
    c.add_argument("--plot", metavar="PNG", help="with WORD: write stacked bars of its "
                   "senses per group")
    c.add_argument("--html", metavar="HTML", help="with WORD: write them as an interactive "
                   "chart")
    c.add_argument("--k", default="auto", help="with WORD: number of senses, or auto")
    where_arg(c)
    index_args(c)
    c.set_defaults(handler=run_senses_change)


def _need(args: argparse.Namespace) -> str:
    from elmo_model.errors import ElmoUserError

    if not args.index:
        raise ElmoUserError("which index? pass --index URI (or set ELMO_INDEX)")
    return str(args.index)


def run_senses_change(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.lookup.senses.maps import check_writable

    for path in (args.out, args.plot, args.html):
        if path:
            check_writable(path)
    if args.out and not str(args.out).endswith(".parquet"):
        raise ElmoUserError(f"--out writes Parquet: name the file FILE.parquet, not {args.out}")
    if args.word is not None:
        return _one_word(args)
    for flag, value in (("--plot", args.plot), ("--html", args.html), ("--where", args.where)):
        if value:
            raise ElmoUserError(f"{flag} draws one word's senses: pass the WORD too "
                                "(elmo senses change WORD --by ...)")
    return _ranking(args)


def _ranking(args: argparse.Namespace) -> int:
    from pipeline.lookup.senses.change import word_changes

    words = args.words.split(",") if args.words is not None else None
    ranking = word_changes(_need(args), args.by, args.bin, words=words, top=args.top,
                           min_uses=args.min_uses, method=args.method, score=args.score,
                           seed=args.seed,
                           progress=sys.stderr.isatty())
    if args.format == "json":
        for row in ranking.rows:
            print(json.dumps(row.to_dict(), ensure_ascii=False))
    else:
        print("\n".join(ranking_lines(ranking)))
    sys.stdout.flush()
    if args.out:
        import pyarrow.parquet as pq

        from pipeline.lookup.senses.maps import check_writable
        from schemas.files import write_whole

        table = ranking.table()
        written = write_whole(check_writable(args.out), lambda tmp: pq.write_table(table, tmp))
        print(f"wrote {written} "
              f"({table.num_rows} words)", file=sys.stderr)
    return 0


def ranking_lines(ranking: Any) -> list[str]:
    """The ranking as a text table, with a header saying what the numbers are."""
    m = ranking.method
    binned = f" in bins of {ranking.bin:g}" if ranking.bin else ""
    left = f"; {ranking.left_out_docs} documents without {ranking.by} left out" \
        if ranking.left_out_docs else ""
    lines = [f"{ranking.candidates} words with {ranking.min_uses}+ uses in two or more of "
             f"{len(ranking.groups)} groups of {ranking.by}{binned} (mix {ranking.mix}"
             f"{left}), ranked by {m}",
             (f"change: {m}'s distance from its mean over {ranking.resamples} shufflings of "
              "the documents' groups, in standard deviations" if ranking.score == "z" else
              f"change: {m} less its mean over {ranking.resamples} shufflings of the "
              "documents' groups")
             + f"; interval: 95% bootstrap of raw {m} (documents resampled)",
             f"{'rank':>4}  {'word':<16} {'change':>7} {'p':>6}  {'prt':>6} {'apd':>6} "
             f"{'jsd':>6} {'ed':>6}  {'interval':<15} {'uses':>6} {'groups':>6}"]
    for r in ranking.rows:
        lo, hi = r.interval
        lines.append(f"{r.rank:>4}  {r.word:<16} {r.change:7.2f} {r.p:6.3f}  "
                     f"{r.scores['prt']:6.3f} {r.scores['apd']:6.3f} {r.scores['jsd']:6.3f} "
                     f"{r.scores['ed']:6.3f}  "
                     f"{f'{lo:.3f}-{hi:.3f}':<15} {sum(r.uses.values()):>6} "
                     f"{len(r.uses):>6}")
    return lines


def _one_word(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.lookup.doc_fields import parse_where
    from pipeline.lookup.senses.over_time import (
        sense_timeline,
        timeline_lines,
        write_timeline_html,
        write_timeline_png,
    )

    for flag, value in (("--words", args.words), ("--top", args.top), ("--out", args.out)):
        if value is not None:
            raise ElmoUserError(f"{flag} ranks words; with WORD leave it out (or drop WORD "
                                "to rank every word)")
    from pipeline.lookup.senses.clusters import sense_count

    k = sense_count(args.k)
    filters = [f for item in args.where for f in parse_where(item)]
    timeline = sense_timeline(_need(args), args.word, args.by, args.bin, k=k,
                              filters=filters, seed=args.seed)
    if args.format == "json":
        print(json.dumps(timeline.to_dict(), ensure_ascii=False, default=str))
    else:
        print("\n".join(timeline_lines(timeline)))
    sys.stdout.flush()
    if args.plot:
        print(f"wrote {write_timeline_png(timeline, args.plot)} (senses per group, stacked "
              "bars)", file=sys.stderr)
    if args.html:
        print(f"wrote {write_timeline_html(timeline, args.html)} (interactive: open it in a "
              "browser)", file=sys.stderr)
    return 0
