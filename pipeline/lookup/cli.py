"""``elmo sql``, ``elmo index``, ``elmo senses`` and ``elmo mix``: the lookup verbs
(``elmo senses`` in ``senses_cli``).

Imports nothing heavy at module level; each handler imports what it needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pipeline.lookup.senses.cli import register_senses

SQL_EPILOG = """\
views: tokens (doc_id, sent_idx, tok_idx, token, char_start, char_end, layer_0..layer_L,
shard), sentences, documents, errors. functions: elmo_mix(layer_0, .., layer_L, 'mix')
-> FLOAT[dim]; elmo_cosine(a, b); elmo_vector(doc_id, sent_idx, tok_idx, 'mix').
User values go in as parameters ($name with --param name=value), never pasted into SQL.

examples:
  elmo sql data/ds "SELECT token, count(*) n FROM tokens GROUP BY ALL ORDER BY n DESC LIMIT 10"
  elmo sql data/ds "SELECT * FROM sentences WHERE text ILIKE '%' || \\$w || '%'" --param w=guitar
  elmo sql data/ds "SELECT doc_id, sent_idx, tok_idx,
      elmo_cosine(elmo_mix(layer_0, layer_1, layer_2, 'top'),
                  elmo_vector('a.txt:3', 0, 4, 'top')) AS sim
      FROM tokens WHERE lower(token) = \\$w ORDER BY sim DESC LIMIT 5" --param w=play
  elmo sql data/ds "SELECT * FROM documents" --format parquet --out docs.parquet
  elmo sql data/ds --verify "SELECT sum(list_sum(layer_2::FLOAT[])) FROM tokens"
  elmo sql data/ds --mix top "SELECT doc_id, sent_idx, tok_idx,
      array_cosine_similarity(vector, (SELECT vector FROM mix_top WHERE doc_id = 'a.txt:3'
          AND sent_idx = 0 AND tok_idx = 4)) AS sim
      FROM mix_top WHERE lower(token) = \\$w ORDER BY sim DESC LIMIT 5" --param w=play
--mix precomputes a mix with elmo's own Parquet reader (1-5M tokens/s) into a table:
repeated comparisons then run in milliseconds instead of decoding the layer lists.
DuckDB does not check Parquet page checksums, so elmo sql first checks the dataset's
files against its manifest (size, sha256, rows, schema): each file version once, then
remembered in ~/.cache/elmo-store ($ELMO_STORE_CACHE) for 24 hours; a file written since
(even with its modification time put back) is read again. --verify reads them all again,
--no-verify skips the check. A damaged file stops the query with the item to --repair; a
damaged or missing file of a derived table (senses) stops only queries of that table.
"""

INDEX_EPILOG = """\
examples:
  elmo index build data/ds --mix top --out data/ds-top.lance
  elmo index info data/ds-top.lance
"""

INDEX_BUILD_EPILOG = """\
One row per stored token with its word (as written, lowercase and stemmed: searches by word
form use the stem) and its sentence's key; each sentence's text is stored once. Building
again adds only the shard files committed since, and drops those no longer committed.
--words, --min-count and --max-count index only some words (any case; counts over the
dataset when the index is created): later builds and job refreshes keep that choice,
--rebuild makes it again.

A new index is compact: its IVF is stored in shards (one per dataset file) holding each
row's vector (float16), a 64-byte code and a sketch; a search process holds only the codes
and sketches (88 bytes a row) and reads a query's candidates' vectors from the mapped
files, so it opens in seconds whatever the size and needs only itself to search. The build
trains on a bounded sample and streams the rest, so its memory follows the codes, not the
vectors; it says before it starts if this machine cannot hold it. --full keeps the vectors
in LanceDB instead, with its IVF_HNSW_SQ (tuned by --index, --nprobes, --ef,
--refine-factor), at about 3.5x the dataset's bytes. An index keeps its kind on later
builds and --rebuild; --full or --compact with --rebuild changes it.

examples:
  elmo index build data/ds --mix top --out data/ds-top.lance
  elmo index build data/ds --mix top --out data/ds-top.lance   # later: adds new shards only
  elmo index build data/ds --mix pos --out data/ds-pos.lance --full --index hnsw --rebuild
  elmo index build data/ds --out data/ds-full.lance --full --nprobes 30 --ef 200
  elmo index build data/ds --out data/ds-play.lance --words play,bank,state
  elmo index build data/ds --out data/ds-mid.lance --min-count 5 --max-count 20000
"""

INDEX_INFO_EPILOG = """\
Prints the dataset the index was built from, its mix, rows, vector index, search
parameters and the document fields it holds (filtered before the vector search).

examples:
  elmo index info data/ds-top.lance
  elmo index info runs/demo/index        # the index `elmo demo` builds
"""

MIX_EPILOG = """\
examples:
  elmo mix list data/ds
  elmo mix fit data/ds --labels pos_labels.csv --name pos
"""

MIX_LIST_EPILOG = """\
Built-in mixes: top, average, layer:<k>; then the mixes stored in <dataset>/_mixes.json
(by elmo mix fit). Wherever a mix is named (elmo sql, elmo index build), inline JSON
works too: {"weights": [0.2, 0.3, 0.5], "gamma": 1.0, "layer_norm": false}.

examples:
  elmo mix list data/ds
"""

MIX_FIT_EPILOG = """\
Fits softmax-normalised layer weights and a scale gamma (Peters et al. 2018, eq. 1) with a
linear probe that predicts your token labels, reports accuracy on held-out sentences
(for the mix and for each single layer), and stores the mix under --name in
<dataset>/_mixes.json.

labels file: CSV, TSV, JSON lines or Parquet with columns doc_id, sent_idx, tok_idx, label
(one row per labelled token; doc_id/sent_idx/tok_idx as in the tokens table).

examples:
  elmo mix fit data/ds --labels pos_labels.csv --name pos
  elmo mix fit data/ds --labels ner.parquet --name ner --lambda 0.1 --epochs 500
"""


def _add(subparsers: Any, name: str, help_: str, epilog: str = "", **kw: Any) -> Any:
    return subparsers.add_parser(name, help=help_, description=help_, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, **kw)


def register(subparsers: Any) -> None:
    p = _add(subparsers, "sql", "run SQL over a dataset with DuckDB", SQL_EPILOG)
    p.add_argument("dataset", metavar="DATASET",
                   help="dataset URI (a directory with _dataset.json)")
    p.add_argument("query", metavar="SQL", help="one SQL statement")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="bind $NAME to VALUE (repeatable); numbers stay text unless cast")
    p.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table",
                   help="table (default, for people), csv, json (JSON lines) or parquet")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout "
                   "(required for parquet)")
    p.add_argument("--max-rows", type=int, default=50, help="table format: rows shown (50)")
    p.add_argument("--mix", action="append", default=[], metavar="MIX",
                   help="precompute table mix_<name> (doc_id, sent_idx, tok_idx, token, "
                        "vector FLOAT[dim]) before the query; repeatable")
    check = p.add_mutually_exclusive_group()
    check.add_argument("--verify", action="store_true",
                       help="read every file against the manifest first, even versions "
                            "found intact before (by default each file version is checked "
                            "once, then trusted for 24 hours: DuckDB does not check Parquet "
                            "page checksums itself)")
    check.add_argument("--no-verify", action="store_true",
                       help="trust the files: skip the check against the manifest")
    p.set_defaults(handler=run_sql)

    index = _add(subparsers, "index", "build LanceDB indexes of mixed token vectors",
                 INDEX_EPILOG)
    verbs = index.add_subparsers(dest="index_command", metavar="VERB")
    b = _add(verbs, "build", "index (or extend an index of) a dataset's tokens under a mix",
             INDEX_BUILD_EPILOG)
    b.add_argument("dataset", metavar="DATASET", help="dataset URI (a directory with "
                   "_dataset.json)")
    b.add_argument("--mix", default="top", help="mix to index (default top; see "
                   "`elmo mix list DATASET`)")
    b.add_argument("--out", required=True, metavar="URI", help="LanceDB directory / URI")
    kind = b.add_mutually_exclusive_group()
    kind.add_argument("--compact", dest="compact", action="store_const", const=True,
                      default=None, help="keep no vectors in the index: quantized codes, "
                      "ranked with the dataset's vectors (what a new index is; see below)")
    kind.add_argument("--full", dest="compact", action="store_const", const=False,
                      help="keep the vectors in the index, with LanceDB's HNSW (3.5x the "
                           "bytes; opens fast, needs no dataset)")
    b.add_argument("--rebuild", action="store_true", help="drop what --out holds and rebuild")
    b.add_argument("--index", choices=("auto", "hnsw", "flat"), default=None,
                   help="--full's vector index: hnsw (LanceDB's IVF_HNSW_SQ, plus an IVF "
                        "that `elmo serve` holds in memory for searches without a word), "
                        "flat (exact) or auto (hnsw from 50k rows)")
    b.add_argument("--nprobes", type=int, default=None,
                   help="--full, LanceDB search: IVF partitions probed (default: 20, or 10 from "
                        "300k rows; giving any search option pins all three; the in-memory "
                        "IVF measures its own at build time)")
    b.add_argument("--ef", type=int, default=None,
                   help="--full, search: HNSW candidate list size (default 150)")
    b.add_argument("--refine-factor", type=int, default=None,
                   help="--full, search: re-rank k*F candidates with full vectors (default 5)")
    b.add_argument("--words", metavar="FILE|W1,W2", default=None,
                   help="index only these words, in any case: a file of words (one a line) "
                        "or a comma-separated list")
    b.add_argument("--min-count", type=int, default=None, metavar="N",
                   help="index only words seen at least N times in the dataset")
    b.add_argument("--max-count", type=int, default=None, metavar="N",
                   help="index only words seen at most N times (e.g. leave out 'the')")
    b.add_argument("--no-progress", action="store_true",
                   help="no progress bars and phase lines on stderr")
    b.set_defaults(handler=run_index_build, setting_flag=_index_build_flag)
    i = _add(verbs, "info", "show what an index holds", INDEX_INFO_EPILOG)
    i.add_argument("uri", metavar="URI",
                   help="the index: the directory / URI `elmo index build` wrote")
    i.set_defaults(handler=run_index_info)
    index.set_defaults(handler=lambda args: _help(index))

    register_senses(subparsers, _add, _help)

    mix = _add(subparsers, "mix", "named layer mixes: list them, fit task weights", MIX_EPILOG)
    mv = mix.add_subparsers(dest="mix_command", metavar="VERB")
    ml = _add(mv, "list", "the mixes a dataset knows", MIX_LIST_EPILOG)
    ml.add_argument("dataset", metavar="DATASET", help="dataset URI")
    ml.set_defaults(handler=run_mix_list)
    mf = _add(mv, "fit", "fit softmax layer weights + gamma with a linear probe on labels",
              MIX_FIT_EPILOG)
    mf.add_argument("dataset", metavar="DATASET", help="dataset URI")
    mf.add_argument("--labels", required=True, metavar="FILE",
                    help="token labels: CSV/TSV/JSONL/Parquet with doc_id, sent_idx, tok_idx, "
                         "label")
    mf.add_argument("--name", required=True, help="name to store the mix under")
    mf.add_argument("--lambda", dest="lam", type=float, default=0.001,
                    help="L2 penalty on the layer scalars (default 0.001; 1 ~ average)")
    mf.add_argument("--epochs", type=int, default=300, help="full-batch Adam steps (300)")
    mf.set_defaults(handler=run_mix_fit)
    mix.set_defaults(handler=lambda args: _help(mix))


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# --------------------------------------------------------------------------- sql


def _params(items: list[str]) -> dict[str, str]:
    from elmo_model.errors import ElmoUserError

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ElmoUserError(f"--param wants NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _cell(value: Any, width: int = 40) -> str:
    if isinstance(value, list):
        head = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value[:3])
        text = f"[{head}{', …' if len(value) > 3 else ''}] ({len(value)})"
    elif isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = "NULL" if value is None else str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def format_table(table: Any, max_rows: int) -> list[str]:
    names = table.column_names
    rows = table.slice(0, max_rows).to_pylist()
    cells = [[_cell(r[n]) for n in names] for r in rows]
    widths = [max([len(n), *(len(c[i]) for c in cells)]) for i, n in enumerate(names)]
    line = "  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    more = table.num_rows - len(rows)
    out.append(f"({table.num_rows} rows{f', {more} not shown (--max-rows)' if more else ''})")
    return out


def run_sql(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.lookup.sql import run_query

    if args.format == "parquet" and not args.out:
        raise ElmoUserError("--format parquet needs --out FILE")
    check = "none" if args.no_verify else "all" if args.verify else "changed"
    table = run_query(args.dataset, args.query, _params(args.param), mixes=args.mix,
                      check=check)
    if args.format == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, args.out, compression="zstd")
        print(f"wrote {table.num_rows} rows to {args.out}", file=sys.stderr)
        return 0
    handle = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    try:
        if args.format == "table":
            handle.write("\n".join(format_table(table, args.max_rows)) + "\n")
        elif args.format == "json":
            for batch in table.to_batches(max_chunksize=4096):
                for row in batch.to_pylist():
                    handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        else:
            import csv

            writer = csv.writer(handle)
            writer.writerow(table.column_names)
            for batch in table.to_batches(max_chunksize=4096):
                for row in batch.to_pylist():
                    writer.writerow([json.dumps(v) if isinstance(v, list | dict) else v
                                     for v in row.values()])
    finally:
        if args.out:
            handle.close()
    return 0


# --------------------------------------------------------------------------- index


# ``build_index``'s settings as ``elmo index build`` spells them (SettingError).
INDEX_BUILD_FLAGS = {"rebuild=True": "--rebuild", "out": "--out", "kind": "--index",
                     "kind and search": "--index, --nprobes, --ef and --refine-factor",
                     "compact=False": "--full"}


def _index_build_flag(setting: str) -> str:
    return INDEX_BUILD_FLAGS.get(setting, "--" + setting.replace("_", "-"))


def run_index_build(args: argparse.Namespace) -> int:
    from pipeline.lookup.index.build import build_index
    from pipeline.lookup.index.meta import SearchParams
    from pipeline.lookup.index.words import WordSelection, parse_words

    search = None
    given = {"nprobes": args.nprobes, "ef": args.ef, "refine_factor": args.refine_factor}
    if any(value is not None for value in given.values()):
        # Checked with the other settings (``BuildSettings``), said with these flags.
        search = SearchParams(**{k: v for k, v in given.items() if v is not None})
    words = WordSelection(parse_words(args.words), args.min_count, args.max_count)
    summary = build_index(args.dataset, args.mix, args.out, kind=args.index or "auto",
                          rebuild=args.rebuild, search=search, words=words,
                          show_progress=not args.no_progress, compact=args.compact,
                          progress=lambda line: print(f"  {line}", file=sys.stderr))
    print(summary.line(), file=sys.stderr)
    hint = compact_hint(args.dataset, args.out)
    if hint:
        print(hint, file=sys.stderr)
    return 0


def compact_hint(dataset: str, out: str) -> str | None:
    """A line suggesting --compact when a full index at ``out`` outweighs its dataset."""
    from pipeline.lookup.index.sense_index import read_meta
    from schemas.files import open_fs

    meta = read_meta(out)
    if meta is None or meta.compact:
        return None
    data_fs, data_root = open_fs(dataset)
    index_fs, index_root = open_fs(out)
    data_bytes, index_bytes = data_fs.du(data_root), index_fs.du(index_root)
    if index_bytes <= data_bytes:
        return None
    return (f"  the index is {index_bytes / data_bytes:.1f}x the dataset's bytes; --compact "
            "--rebuild makes one of about a third of that at the same recall, which a "
            "searching process holds at 88 bytes a token (its vectors stay on disk, mapped)")


def run_index_info(args: argparse.Namespace) -> int:
    from pipeline.lookup.index.sense_index import SenseIndex

    ix = SenseIndex(args.uri, any_layout=True)
    m = ix.meta
    fields = ", ".join(f"{name} ({kind})" for name, kind in ix.indexed_fields().items())
    if m.doc_fields is None:
        fields += " (others are filtered on a join; a rebuild stores them)"
    vectors = "compact: codes in memory, int8 vectors in its shards" if m.compact \
        else f"{m.vector_dtype} vectors"
    ivf = m.ivf or {}
    directions = f"in {ivf['projected_dim']} of {m.dim} directions" \
        if "projected_dim" in ivf else "of the raw values (before their projection: a build " \
        "trains them again)"
    search = (f"in-memory, {ivf.get('codes')} codes {directions} trained on "
              f"{ivf.get('trained_rows')} rows, "
              f"{ivf.get('nprobe')} of {ivf.get('lists')} lists probed, "
              f"{ivf.get('candidates') or 'default'} candidates a result re-ranked, "
              f"{'with' if ivf.get('sketches', True) else 'without'} sketches, "
              f"recall@10 {ivf.get('recall_at_10')} measured") \
        if m.compact else (
        f"nprobes {m.search.nprobes}, ef {m.search.ef}, refine {m.search.refine_factor}")
    print(f"index {args.uri}\n  dataset {m.dataset}\n  mix {ix.mix.describe()}\n"
          f"  rows {ix.table.count_rows()}, dim {m.dim}, vector index {m.built} ({search})\n"
          f"  shard files {len(m.indexed)}\n"
          f"  word forms {m.stemmer + ' stems' if ix.has_stems else 'not indexed: rebuild'}\n"
          f"  words {m.selection().describe()}\n"
          f"  layout {m.layout} ({vectors}, sentence text "
          f"{'once per sentence' if ix.sentences is not None else 'in every row'})\n"
          f"  document fields {fields}")
    return 0


# --------------------------------------------------------------------------- mix


def run_mix_list(args: argparse.Namespace) -> int:
    from schemas.dataset import open_dataset
    from schemas.mix_specs import builtin_mix

    ds = open_dataset(args.dataset)
    n = ds.descriptor.n_output_layers
    for name in ("top", "average", *(f"layer:{k}" for k in range(n))):
        mix = builtin_mix(name, n)
        assert mix is not None
        print(f"  {mix.describe()}")
    for mix in ds.mixes().values():
        info = f"  ({mix.info})" if mix.info else ""
        print(f"  {mix.describe()}{info}")
    return 0


def run_mix_fit(args: argparse.Namespace) -> int:
    from pipeline.lookup.layers.probe import fit_mix

    result = fit_mix(args.dataset, args.labels, args.name, lam=args.lam, epochs=args.epochs)
    print(f"fitted mix {args.name!r} on {result.n_train} tokens ({len(result.classes)} "
          f"classes), held-out {result.n_test} tokens:")
    for line in result.chart():
        print(f"  {line}")
    print(f"stored in {args.dataset.rstrip('/')}/_mixes.json", file=sys.stderr)
    return 0
