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
it is used across the groups. Words are the index's word forms, as search matches them
(plays, played, playing are one word). Uses are distinct contexts: a sentence repeated in
many documents of a group (a boilerplate paragraph; a template's lines, which differ only
in numbers or paths) counts once there, in the ranking and with WORD alike.

Scores (all four on every row; --method picks the one ranked by):
  prt   cosine distance between the groups' mean vectors
  apd   average cosine distance between two uses from different groups
  jsd   Jensen-Shannon divergence between the groups' shares of the word's senses
  ed    energy distance: apd less the average distance between two uses of one group, so
        a word whose uses vary a lot (two steady senses) does not look changed
With more than two groups prt, apd and ed average every pair of groups.

How to read a row:
  change    how much more the groups differ than they would by chance: the method's
            score less its mean when the documents' groups are shuffled (--score excess,
            the default). 0: no more than chance. A rare word's raw score is high by
            chance alone; this takes that out, so frequency does not decide the order.
            --score z ranks by that distance in the shuffles' standard deviations
            instead: how sure, not how much; it grows with a word's uses and puts
            frequent function words (the, of, a) on top.
  p         the share of shuffles scoring at least as high: small means unlikely by
            chance. Shuffles adapt: more for a word few shuffles reach, so p is not
            stuck at 1/(shuffles+1).
  q         p corrected for ranking many words at once (Benjamini-Hochberg): among the
            words with q <= 0.05, at most about 5% are expected to be chance.
  sig       * when q <= --max-q (default 0.05). Significant words come first, by change;
            the others follow, by change, unmarked.
  interval  a 95% bootstrap interval of the raw score (documents resampled).
  contexts  distinct contexts in the groups the word counts in.
Shuffles and bootstrap resample whole documents (in blocks), not uses, since the uses in
one document are not independent. Computed in one pass over the index's vectors.

When the top words look like noise: read one (elmo senses change WORD --by ...) to see
whether its senses' shares really move; raise --min-uses (fewer rare words); widen --bin
(more uses per group); lower --max-q; try --method ed (leaves out words whose uses simply
vary) or jsd (senses' shares). Topic drift (a feature's name used more) is a change of
use, not of meaning: the senses view tells them apart.

With WORD: the word's senses (clusters, as `elmo senses cluster`, over all its forms) and
the share of each per group, counted in distinct contexts, as a table; --plot writes
stacked bars (PNG), --html an interactive chart.

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
    from pipeline.lookup.senses.change_significance import DEFAULT_MAX_Q

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
                   help=f"uses (distinct contexts) a word needs in a group to count "
                        f"there (default {DEFAULT_MIN_USES})")
    c.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                   help=f"score that ranks the words (default {DEFAULT_METHOD}: best on "
                        "bench/senses_change.py, docs/senses.md)")
    c.add_argument("--score", choices=SCORES, default=DEFAULT_SCORE,
                   help="what change is: excess (default: how much, the score less its "
                        "mean with the groups shuffled) or z (how sure: that distance in "
                        "the shuffles' standard deviations; favours frequent words)")
    c.add_argument("--max-q", type=float, default=DEFAULT_MAX_Q, metavar="Q",
                   help=f"false discovery rate: words with q <= Q are significant and "
                        f"ranked first (default {DEFAULT_MAX_Q:g})")
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
                           max_q=args.max_q, seed=args.seed,
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
    repeats = f"; {ranking.repeats} repeated uses left out" if ranking.repeats else ""
    lines = [f"{ranking.candidates} words with {ranking.min_uses}+ distinct contexts in two "
             f"or more of {len(ranking.groups)} groups of {ranking.by}{binned} (mix "
             f"{ranking.mix}{left}), ranked by {m}; contexts: uses with a sentence repeated "
             f"in many documents counted once{repeats}",
             (f"change: {m}'s distance from its mean over shufflings of the documents' "
              "groups, in standard deviations" if ranking.score == "z" else
              f"change: {m} less its mean over shufflings of the documents' groups (0: "
              "chance)")
             + f"; p: share of shuffles as high ({ranking.resamples} or more); q: "
               "Benjamini-Hochberg across the words",
             f"{ranking.significant} of {ranking.candidates} words significant (* sig: q <= "
             f"{ranking.max_q:g}), ranked first; interval: 95% bootstrap of raw {m} "
             "(documents resampled)",
             f"{'rank':>4}  {'word':<16} {'change':>7} {'p':>7} {'q':>6} sig  {'prt':>6} "
             f"{'apd':>6} {'jsd':>6} {'ed':>6}  {'interval':<15} {'contexts':>8} "
             f"{'groups':>6}"]
    for r in ranking.rows:
        lo, hi = r.interval
        lines.append(f"{r.rank:>4}  {r.word:<16} {r.change:7.3f} {r.p:7.5f} {r.q:6.3f} "
                     f"{'*' if r.significant else ' ':>3}  "
                     f"{r.scores['prt']:6.3f} {r.scores['apd']:6.3f} {r.scores['jsd']:6.3f} "
                     f"{r.scores['ed']:6.3f}  "
                     f"{f'{lo:.3f}-{hi:.3f}':<15} {sum(r.uses.values()):>8} "
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
