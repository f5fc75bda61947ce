"""``elmo dataset verify``: check every committed file of a dataset against its manifest.

Imports nothing heavy at module level; the handler imports the checks (pyarrow, fsspec).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from elmo_model.cli import key_values

DATASET_EPILOG = """\
examples:
  elmo dataset verify runs/example            # every committed file against the manifest
  elmo dataset verify s3://bucket/ds --json
"""

VERIFY_EPILOG = """\
examples:
  elmo dataset verify runs/example
  elmo dataset verify s3://bucket/ds --storage-option anon=false --json
  elmo embed 'examples/corpus/*.txt' --out runs/example --repair   # re-embed what it found

Every file each commit record (_manifest/<part>/shard=<k>.json) lists is read once and
checked: present, the recorded size (else: truncated), the recorded sha256 (else:
corrupt), then the recorded row count and the schema the descriptor implies. Each
problem is one line naming the file and the part and work item (input file and byte
range) that produced it; rerunning that part's `elmo embed` with --repair re-embeds
exactly those items. Records without a hash (older datasets) are checked without one.
The derived tables' files (_derived.json: senses) are checked the same way; a damaged or
missing one names the command that writes it again (`elmo senses label WORD`). Files in
derived/ that _derived.json does not list (left by a killed writer) are reported; the
next write of their table deletes them.
Exit status: 0 when every file checks out, 1 when any is damaged, 2 on misuse.
"""


def register(subparsers: Any) -> None:
    group = subparsers.add_parser(
        "dataset", help="check a stored dataset (verify)",
        description="Work with a stored dataset as a whole.", epilog=DATASET_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = group.add_subparsers(dest="dataset_command", metavar="VERB")
    group.set_defaults(handler=lambda _args: _usage(group))
    v = verbs.add_parser(
        "verify", help="check every committed file against the manifest",
        description="Check every committed file of DATASET (any fsspec URI) against its "
                    "commit record: missing, truncated, corrupt, wrong row count or schema.",
        epilog=VERIFY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("dataset", metavar="DATASET", help="dataset URI (local path, s3://, ...)")
    v.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec storage option for DATASET (repeatable; values are JSON "
                        "when they parse as JSON, else strings)")
    v.add_argument("--json", action="store_true",
                   help="print one JSON object (ok, files_checked, bytes_checked, problems)")
    v.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    v.set_defaults(handler=run_verify)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from schemas.dataset import open_dataset
    from schemas.derived_tables import unlisted_files
    from schemas.verify import expected_derived_files, expected_files, verify_dataset

    options = key_values(args.storage_option, "--storage-option", "anon=true")
    ds = open_dataset(args.dataset, options or None)
    wanted = expected_files(ds.fs, ds.root) + expected_derived_files(ds.fs, ds.root)
    unlisted = unlisted_files(ds.fs, ds.root)
    total = sum(e.size or 0 for e in wanted)
    tty = sys.stderr.isatty()
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr,
              disable=not args.progress, mininterval=0.5 if tty else 30.0) as bar:
        report = verify_dataset(ds.fs, ds.root, ds.descriptor, on_bytes=bar.update,
                                wanted=wanted)
    if args.json:
        print(json.dumps({"dataset": args.dataset, **report.to_json(),
                          "unlisted_derived": unlisted}, indent=1))
    else:
        for check in report.problems:
            print(check.line())
        print(_summary(report))
        if unlisted:
            print(f"note: {len(unlisted)} file(s) under derived/ that _derived.json does not "
                  f"list, left by an interrupted write (first {unlisted[0]}); the next write "
                  "of their table deletes them")
    return 1 if report.problems else 0


def _summary(report: Any) -> str:
    """The last line: what was checked, and what mends what is damaged."""
    head = f"{len(report.files)} files, {report.bytes_checked:,} bytes checked: "
    if not report.problems:
        return head + "all match the manifest"
    fixes = []
    bad = {part: items for part, items in report.bad_items().items()
           if any(c.part == part for c in report.core_problems)}
    if bad:
        fixes.append("in " + "; ".join(f"part {p} items {', '.join(map(str, sorted(i)))}"
                                       for p, i in sorted(bad.items()))
                     + ": rerun their `elmo embed` with --repair")
    if report.derived_problems:
        fixes.append(f"{len(report.derived_problems)} in derived tables: write each again "
                     "with the command its line names")
    return head + f"{len(report.problems)} damaged, " + "; ".join(fixes)
