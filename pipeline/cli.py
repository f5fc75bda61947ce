"""The ``elmo`` command: one dispatcher; each area registers its own verbs.

Registrars import nothing heavy at module level, so ``elmo --help`` stays fast; torch,
ray and friends are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# Modules exposing ``register(subparsers)``; each adds its verbs and sets ``handler``.
REGISTRARS = (
    "elmo_model.cli",
    "pipeline.embed_cli",
    "pipeline.verify_cli",
    "pipeline.lookup.cli",
    "pipeline.lookup.serve.cli",
    "pipeline.lookup.pooled.cli",
    "jobs.cli",
    "pipeline.demo",
)

# Commands whose work is faiss's, one query (or one batch of codes) a call: between
# calls OpenMP's threads spin by default, and where the cores are busy that spin costs
# many times the CPU of the work itself (BENCHMARKS.md, "The sense index at corpus
# scale"). Passive waits sleep instead. Embedding keeps the default: its many small
# parallel regions a step want threads awake.
PASSIVE_WAIT_COMMANDS = frozenset({"index", "senses", "serve"})


def quiet_thread_waits(command: str | None, environ: dict[str, str] | None = None) -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` for ``command`` if it is one of
    ``PASSIVE_WAIT_COMMANDS`` and the user set no policy; read when faiss and torch load
    their OpenMP runtimes, so before they are imported (the parser imports neither)."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    if command in PASSIVE_WAIT_COMMANDS:
        environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def fixed_mmap_threshold(command: str | None) -> bool:
    """An index build keeps its large allocations on their own mmap, as the embedding
    workers do (``process_memory``): with glibc's sliding threshold each shard's mix
    buffers stayed in the heap, and what the build held grew with the files it had
    written (0.60 -> 0.87 GB over 3 files of 213k rows at 1024 wide; 0.64 fixed). Not
    the searching commands: for a server it saved no memory a row measurably and cost
    2 ms a search (BENCHMARKS.md, issue 46)."""
    if command != "index":
        return False
    from pipeline.write.process_memory import fix_mmap_threshold

    return fix_mmap_threshold()


DESCRIPTION = """\
elmo: corpus-scale ELMo embeddings: embed, store every layer, query with SQL, search senses.

examples (from the repository root; README.md, "Using it", runs them all in order):
  elmo demo                                               # the tour `make run` gives
  elmo embed 'examples/corpus/*.txt' --out runs/example   # every layer of every token
  elmo dataset verify runs/example                        # every file against the manifest
  elmo sql runs/example "SELECT token, count(*) n FROM tokens GROUP BY 1 ORDER BY n DESC LIMIT 5"
  elmo index build runs/example --mix top --out runs/example-top.lance
  elmo senses search "Will you play upon this pipe ?" --word play --index runs/example-top.lance
  elmo serve runs/example --index runs/example-top.lance   # HTTP API + explorer page on :8000
  elmo mix fit runs/example --labels examples/pos_labels.csv --name pos
  elmo jobs run examples/job.toml                         # incremental, scheduled
  elmo train 'examples/corpus/*.txt' --config examples/tiny_options.json --out runs/tiny-lm
  elmo model info models/default

Each COMMAND has --help with more examples.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elmo", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in REGISTRARS:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from elmo_model.errors import ElmoUserError, SettingError, cli_flag

    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_thread_waits(args.command)
    fixed_mmap_threshold(args.command)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except ElmoUserError as error:
        # A library error about a setting names it as this command's flag (``--init-from``
        # for ``init_from``, or the verb's own ``setting_flag``); others print as they are.
        flag = getattr(args, "setting_flag", None) or cli_flag
        message = error.named(flag) if isinstance(error, SettingError) else error
        print(f"elmo: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("elmo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`elmo sql ... | head`): stop quietly, as other tools do.
        # Python would otherwise report the failed flush of stdout again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as error:  # after BrokenPipeError, an OSError too
        # A full disk is no bug: one line, not a traceback (`elmo embed` says more, what
        # it stored: embed_cli.run). Every writer writes under temporary names and moves
        # them whole, so running the same command again finishes.
        from pipeline.embed_cli import disk_full

        reason = disk_full(error)
        if reason is None:
            raise
        print(f"elmo: error: the disk is full ({reason}): free space and run the same "
              "command again", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
