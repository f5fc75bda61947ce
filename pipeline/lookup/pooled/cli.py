"""``elmo pool`` and ``elmo search passages``. Imports nothing heavy at module level."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pipeline.lookup.pooled.pooling import BY, DEFAULT_METHOD, DEFAULT_MIX, METHODS

POOL_EPILOG = f"""\
Pools the mixed token vectors of each sentence (--by sentence) or document (--by document)
into one vector and stores them in the dataset as the derived table sentence_vectors or
document_vectors: doc_id, [sent_idx,] mix, method, model, n_tokens, tokens_shard, vector
(float32 list). One file per mix, method and tokens shard, listed in _derived.json:
`elmo dataset verify` checks them, `elmo sql` shows them as views joinable with
sentences and documents, and any Parquet reader (DuckDB, pyarrow, polars, Spark) reads
them (docs/dataset_format.md, "Derived tables").

Methods: mean (the average token vector), unit_mean (the average of unit-length token
vectors), max (element-wise maximum), mean_max (mean and max side by side, twice as
wide). Defaults (--mix {DEFAULT_MIX}, --method {DEFAULT_METHOD}) were chosen by measurement
(bench/pooled_features.py, BENCHMARKS.md "issue 49").

Pooling again pools only the tokens shards not pooled yet for that mix and method (a
grown dataset: its new documents); shards no longer live lose their rows; --rebuild pools
everything again (after refitting a stored mix under the same name).

examples:
  elmo pool runs/example --by sentence
  elmo pool runs/example --by document --mix top --method max
  elmo sql runs/example "SELECT s.text, v.n_tokens FROM sentence_vectors v
      JOIN sentences s USING (doc_id, sent_idx) LIMIT 3"
"""

SEARCH_EPILOG = f"""\
Finds the stored sentences (--by sentence) or documents (--by document) whose pooled
vectors (`elmo pool`) are nearest by cosine to TEXT's: TEXT is tokenized with the
dataset's tokenizer, embedded with its model, mixed and pooled the same way. Each hit has
its text and its document's fields. The search is exact (every pooled row).

--where keeps only documents whose fields pass: year>=1900, year=1900..1950, party=A|B,
source~moby (contains, any case); repeat it to combine.

examples:
  elmo search passages "Will you play upon this pipe ?" --dataset runs/example -k 5
  elmo search passages "the whale" --dataset runs/example --by document --where source~moby
  elmo search passages "Call me Ishmael" --dataset runs/example --format json

defaults: --mix {DEFAULT_MIX} --method {DEFAULT_METHOD} --by sentence -k 10
"""


def _add(subparsers: Any, name: str, help_: str, epilog: str) -> Any:
    return subparsers.add_parser(name, help=help_, description=help_, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def _pooling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mix", default=DEFAULT_MIX,
                   help=f"a named mix: top, average, layer:<k> or a stored one "
                        f"(default {DEFAULT_MIX})")
    p.add_argument("--by", choices=BY, default="sentence",
                   help="one vector per sentence (default) or per document")
    p.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                   help=f"how token vectors are pooled (default {DEFAULT_METHOD})")


def register(subparsers: Any) -> None:
    p = _add(subparsers, "pool", "store one vector per sentence or document (pooled "
             "token vectors) in a dataset", POOL_EPILOG)
    p.add_argument("dataset", metavar="DATASET", help="dataset URI")
    _pooling_args(p)
    p.add_argument("--rebuild", action="store_true",
                   help="pool every shard again, not only the new ones")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    p.set_defaults(handler=run_pool)

    search = _add(subparsers, "search", "search a dataset by passage",
                  "examples:\n  elmo search passages \"Will you play upon this pipe ?\" "
                  "--dataset runs/example\n")
    verbs = search.add_subparsers(dest="search_verb", metavar="VERB", required=True)
    q = _add(verbs, "passages", "the stored sentences or documents nearest to a text",
             SEARCH_EPILOG)
    q.add_argument("text", metavar="TEXT", help="the passage to search for")
    q.add_argument("--dataset", metavar="URI", help="the dataset (pooled with `elmo pool`)")
    q.add_argument("--index", metavar="URI",
                   help="a sense index: search the dataset it was built from")
    q.add_argument("-k", type=int, default=10, help="hits to return (default 10)")
    _pooling_args(q)
    q.add_argument("--where", action="append", default=[], metavar="COND",
                   help="document field condition (repeatable)")
    q.add_argument("--model-dir", metavar="DIR",
                   help="the dataset's model, if it moved since the dataset was written")
    q.add_argument("--format", choices=("table", "json"), default="table",
                   help="table (for people) or json (one object per hit, a line each)")
    q.set_defaults(handler=run_search_passages)


def run_pool(args: argparse.Namespace) -> int:
    from pipeline.lookup.pooled.store import pool_dataset

    summary = pool_dataset(args.dataset, args.mix, args.by, args.method,
                           rebuild=args.rebuild, progress=args.progress,
                           say=lambda line: print(line, file=sys.stderr))
    print(summary.line())
    return 0


def run_search_passages(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.lookup.pooled.search import PassageSearch, check_k

    check_k(args.k)
    dataset = args.dataset
    if args.index:
        from pipeline.lookup.index.meta import read_meta

        meta = read_meta(args.index)
        if meta is None:
            raise ElmoUserError(f"{args.index} is not a sense index (no index metadata)")
        if dataset and dataset != meta.dataset:
            raise ElmoUserError(f"--index {args.index} was built from {meta.dataset}, not "
                                f"--dataset {dataset}; pass one of them")
        dataset = meta.dataset
    if not dataset:
        raise ElmoUserError("which dataset? pass --dataset URI (or --index URI)")
    hits = PassageSearch(dataset, model_dir=args.model_dir).search(
        args.text, k=args.k, by=args.by, mix=args.mix, method=args.method,
        where=args.where)
    if args.format == "json":
        for hit in hits:
            print(json.dumps(hit.to_dict(), ensure_ascii=False, default=str))
    else:
        print("\n".join(hit.line() for hit in hits) if hits else "no hits")
    return 0
