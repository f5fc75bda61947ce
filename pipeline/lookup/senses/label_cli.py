"""``elmo senses label``: each use's sense written into the dataset (table ``senses``).
Registered by ``senses.cli.register_senses``; imports nothing heavy at module level."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

SENSES_LABEL_EPILOG = """\
Clusters each WORD's uses into senses (as `elmo senses cluster` does: --k auto picks k by
silhouette) and writes every use's sense into the index's dataset as the derived table
`senses`: word, doc_id, sent_idx, tok_idx (the token's key), token, sense (1 = the
largest), label (the sense's most typical context words), distance (cosine distance to
the sense's centre), model (fingerprint) and mix. Labelling a word again replaces all its
rows at once. `elmo sql` and `/sql` show it as the view `senses`; `elmo dataset verify`
checks its files; any Parquet reader reads them (docs/dataset_format.md, "Derived tables").

examples:
  elmo senses label union state --index data/sotu-top.lance
  elmo sql data/sotu "SELECT s.sense, s.label, d.year // 10 * 10 AS decade, count(*) AS uses
      FROM senses s JOIN documents d USING (doc_id) WHERE s.word = 'union' GROUP BY ALL
      ORDER BY decade, s.sense"
"""


def add_label_parser(verbs: Any, add: Callable[..., Any],
                     index_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = add(verbs, "label", "write each use's sense into the dataset (table senses)",
            SENSES_LABEL_EPILOG)
    p.add_argument("words", nargs="+", metavar="WORD", help="word(s) to label, each on its "
                   "own (matched in lowercase)")
    p.add_argument("--k", default="auto", help="number of senses, or auto (silhouette)")
    p.add_argument("--centre", choices=("case", "forms", "none"), default="case",
                   help="centre written forms before clustering (as senses cluster)")
    index_args(p)
    p.set_defaults(handler=run_senses_label)


def run_senses_label(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.lookup.senses.labels import label_words, labels_summary

    if not args.index:
        raise ElmoUserError("which index? pass --index URI (or set ELMO_INDEX)")
    from pipeline.lookup.senses.clusters import sense_count

    k = sense_count(args.k)
    print("\n".join(labels_summary(label_words(args.index, args.words, k,
                                               centre=args.centre))))
    return 0
