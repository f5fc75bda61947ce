"""``elmo embed``: corpus glob -> partitioned Parquet of every biLM layer.

The flags, their defaults, choices and help come from ``EmbedConfig``'s fields
(pipeline/write/config.py). Imports nothing heavy at module level; the handler imports the
pipeline.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from pipeline.write.config import EmbedConfig, flag_of
from pipeline.write.inputs import ReadOptions
from pipeline.write.setting import SettingField, settings_fields

EPILOG = """\
examples:
  elmo embed 'corpus/*.txt' --out data/ds --model models/default
  elmo embed 'corpus/*.jsonl' --out data/ds --options options.json --weights weights.hdf5
  elmo embed 'books/*.txt' --doc-per file --out data/books --dtype float32
  elmo embed 'tok/*.txt' --pretokenized --out data/tok --executor ray --actors 2
  elmo embed 'corpus/*.txt' --out data/ds --tokenizer elmo-store-ptb
  elmo embed 'corpus/*.txt' --out data/ds --device cpu --compute-dtype bfloat16
  on a Ray cluster (see ray_cluster.yaml and docs/jobs.md), from the head node:
  elmo embed 's3://bucket/corpus/**/*.txt' --out s3://bucket/ds --ray-address auto \\
      --actors 8 --device cuda --compute-dtype float16 --wait-for-resources 600

How it runs: the driver lists the inputs and cuts them into work items (byte ranges of
about --item-tokens tokens, at least --shards of them; no text is read by the driver).
Workers (this process, or Ray actors holding the model) read, tokenize, embed and write
each item to staging; the driver commits finished items into the manifest. Only small
commit records come back to the driver, so its memory does not grow with the corpus.
Before any work the run checks that the cluster can hold the actors and that the model
loads; a run that fails before its first commit leaves --out as it found it.

Compute dtype: bfloat16 runs 1.6-3.4x faster than float32 on CPUs with bf16 matmul
support (AVX512-BF16/AMX; bench/bilm_throughput.py), vectors within cosine 0.99999 of
float32's; float16 compute is CUDA only. It is recorded in the descriptor's "extra" and
in each item's manifest entry, and a rerun with another compute dtype is not refused.

Output: hive-partitioned Parquet under --out (tokens/, sentences/, documents/, errors/,
shard=K/ where K is the work item), layers stored as {dtype} by default (--dtype; zstd,
snappy for layers 1..L; see docs/dataset_format.md). Re-running the same command after
a crash or kill finishes only the items that were not committed, and the dataset equals
an uninterrupted run's. A full disk stops the run with one line saying how many work
items were stored; nothing is half written, and the same command finishes the rest once
there is space.
Exit status: 0 when the run finished and stored anything; 1 when nothing could be
processed, or the run stopped early (the disk filled up: what was committed stays, rerun
to finish); 2 on misuse (a bad flag, an input that does not exist, --out in use).
"""


def output_epilog() -> str:
    """``EPILOG`` naming the storage dtype the config defaults to (defined there, once)."""
    return EPILOG.replace("{dtype}", EmbedConfig.__dataclass_fields__["dtype"].default)


class NamesWholeFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps help text at spaces only: names such as ``elmo-store-words`` stay whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "embed",
        help="embed a corpus into partitioned Parquet (every layer of every token)",
        description="Embed every token of a corpus (text, JSON Lines or Parquet, on any "
                    "fsspec file system) with the biLM and store every layer of every token "
                    "as hive-partitioned Parquet, exactly once and resumable: the product's "
                    "main job. Runs in-process, or on a Ray cluster with --actors/--ray-address.",
        epilog=output_epilog(),
        formatter_class=NamesWholeFormatter,
    )
    helps = {f.name: f.setting.help for f in settings_fields(EmbedConfig)}
    p.add_argument("sources", nargs="+", metavar="SOURCE_GLOB", help=helps["sources"])
    p.add_argument("--out", required=True, metavar="URI", help=helps["out"])
    model = p.add_argument_group("model (default: the bundled models/default)")
    model.add_argument("--model", metavar="DIR", help=helps["model"])
    model.add_argument("--options", metavar="FILE", help="bilm-tf options.json")
    model.add_argument("--weights", metavar="FILE", help="weights .hdf5 or .safetensors")
    for field in settings_fields(EmbedConfig):
        if field.name == "read":
            for read_field in settings_fields(ReadOptions):
                _add_flag(p, read_field)
        elif not field.setting.custom and field.setting.flag:
            _add_flag(p, field)
    p.set_defaults(handler=run, setting_flag=flag_of)


def _add_flag(parser: argparse.ArgumentParser, field: SettingField) -> None:
    """One flag from its field's ``Setting``: dest is the field name."""
    s = field.setting
    kwargs: dict[str, Any] = {"dest": field.name, "help": s.help}
    if field.kind is bool:
        # A setting that is on by default is turned off by a --no-... flag.
        kwargs["action"] = "store_false" if field.default else "store_true"
    else:
        kwargs["type"] = field.kind
        kwargs["default"] = field.default
        if s.choices:
            kwargs["choices"] = s.choices
        if not s.choices:  # argparse would name it after the field, not the flag
            kwargs["metavar"] = s.metavar or s.flag.lstrip("-").replace("-", "_").upper()
        if s.names:
            kwargs["help"] = f"{s.help}; one of: {', '.join(s.names())}"
    parser.add_argument(s.flag, **kwargs)


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``pipeline.embed``'s settings of parsed ``elmo embed`` arguments."""
    flagged = {f.name: getattr(args, f.name) for f in settings_fields(EmbedConfig)
               if not f.setting.custom and f.setting.flag}
    read = {f.name: getattr(args, f.name) for f in settings_fields(ReadOptions)}
    return {"model": args.model, "options": args.options, "weights": args.weights,
            **flagged, **read}


# errno values of a store that is out of room: no space, over quota, file too large.
DISK_FULL_ERRNOS = (28, 122, 27)
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large")


def disk_full(error: BaseException) -> str | None:
    """What says the store is full in ``error`` or what caused it (Ray and pyarrow wrap
    it), as a reason for people; None when nothing does."""
    seen: BaseException | None = error
    while seen is not None:
        code = getattr(seen, "errno", None)
        if code in DISK_FULL_ERRNOS:
            return DISK_FULL_TEXTS[DISK_FULL_ERRNOS.index(code)].lower()
        for text in DISK_FULL_TEXTS:
            if text in str(seen):
                return text.lower()
        seen = seen.__cause__ or seen.__context__
    return None


def stored_items(out: str, part: str) -> int | None:
    """Work items committed in ``out``'s ``part`` (None when it cannot be read)."""
    try:
        from schemas.files import open_fs
        from schemas.manifest import committed_items

        return len(committed_items(*open_fs(out), part))
    except Exception:
        return None


def run(args: argparse.Namespace) -> int:
    import pipeline  # each entry imports the pipeline (pyarrow, fsspec, ...) when called

    try:
        summary = pipeline.embed(args.sources, args.out, **settings_from_args(args))
    except Exception as error:
        reason = disk_full(error)
        if reason is None:
            raise
        stored = stored_items(args.out, args.part)
        done = "" if stored is None else f"{stored} work item(s) of part {args.part} stored; "
        print(f"elmo: error: {args.out}: the disk is full ({reason}): {done}nothing is half "
              "written. Free space and rerun the same command to finish the rest",
              file=sys.stderr)
        return 1
    for line in summary.lines():
        print(line, file=sys.stderr)
    return 0 if summary.totals.get("documents", 0) > 0 else 1
