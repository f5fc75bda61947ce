"""``elmo serve``: the dataset, its model and its sense indexes behind one HTTP server.

Imports nothing heavy at module level; the handler imports the server when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from elmo_model.errors import cli_flag
from pipeline.lookup.serve.limits import MIN_SQL_MEMORY_MB, SQL_MEMORY_MB, SQL_TIMEOUT_S

LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "ELMO_SERVE_TOKEN"

SERVE_EPILOG = """\
Loads the dataset's model and opens the dataset and its indexes once, then answers HTTP:
the sense explorer page at /, the API at /info, /embed, /senses/search, /senses/WORD,
/occurrences/WORD, /sentences/DOC_ID/SENT_IDX and /sql (read-only SELECT), its OpenAPI
description at /openapi.json and /docs (docs/serving.md). Concurrent requests share
model calls and index searches.

It listens on 127.0.0.1 only. Any other --host needs --token (or $ELMO_SERVE_TOKEN):
every request must then send `Authorization: Bearer TOKEN`.

examples:
  elmo serve runs/demo/dataset --index runs/demo/index            # open http://127.0.0.1:8000/
  elmo serve runs/example --index runs/example-top.lance --port 8100
  elmo serve data/ds --index top=data/ds-top.lance --index pos=data/ds-pos.lance
  elmo serve data/ds --index data/ds-top.lance --host 0.0.0.0 --token "$(openssl rand -hex 16)"
  elmo serve data/ds --index data/ds-top.lance --ray-address auto --replicas 4 --host 0.0.0.0 \\
      --token "$ELMO_SERVE_TOKEN"                      # on Ray Serve, 4 copies
  elmo serve data/ds --index data/ds-top.lance --ray-address auto --replicas 2 \\
      --shard-actors auto     # a compact index's shards held by actors, one a node
  curl -s localhost:8000/senses/search -H 'content-type: application/json' \\
      -d '{"sentence": "He plays the guitar in a band", "word": "plays", "k": 5}'
"""


# ``ServedStore.open``'s settings whose flags differ from ``cli_flag``'s rule.
SERVE_FLAGS = {"index_specs": "--index", "model_dir": "--model"}


def serve_flag(setting: str) -> str:
    return SERVE_FLAGS.get(setting) or cli_flag(setting)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a dataset over HTTP: API and sense explorer page",
        description="serve a dataset over HTTP: API and sense explorer page",
        epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", metavar="DATASET", help="dataset URI (a directory with "
                   "_dataset.json)")
    p.add_argument("--index", action="append", default=[], metavar="[NAME=]URI",
                   help="a sense index of DATASET built by `elmo index build` (repeatable; "
                        "named by its directory unless NAME= is given; the first is the "
                        "default)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; others need --token)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--token", default=os.environ.get(TOKEN_ENV), metavar="TOKEN",
                   help=f"require `Authorization: Bearer TOKEN` (default ${TOKEN_ENV})")
    p.add_argument("--model", metavar="DIR", help="model directory (default: the dataset's)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="run on Ray Serve instead: a cluster address (auto, ray://HOST:PORT) "
                        "or local (start Ray here)")
    p.add_argument("--replicas", type=int, default=1,
                   help="with --ray-address: copies of the server, each with its own model "
                        "(default 1)")
    p.add_argument("--shard-actors", metavar="N|auto",
                   help="with --ray-address: search each index (compact, in shards) with N "
                        "Ray actors that each hold some of its shards (auto: one per node "
                        "with a CPU), shared by the replicas, which then open no shard; the "
                        "hits are one process's (docs/index_sizing.md)")
    p.add_argument("--sql-timeout", type=float, default=SQL_TIMEOUT_S, metavar="SECONDS",
                   help=f"stop a /sql query after this long (default {SQL_TIMEOUT_S:g})")
    p.add_argument("--sql-memory", type=int, default=SQL_MEMORY_MB, metavar="MB",
                   help="memory a /sql query may take (default %(default)s). /sql runs in a "
                        "worker process capped at its idle size plus this: a query that "
                        "needs more gets one line naming the limit and the worker is "
                        "started again; the server itself never grows with a query. "
                        f"At least {MIN_SQL_MEMORY_MB}")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking the dataset's files against its manifest (by "
                        "default at start and before each /sql query, as `elmo sql` does: "
                        "each file version is read once, a changed one again; /sql runs "
                        "on DuckDB, which skips page checksums)")
    p.set_defaults(handler=run_serve, setting_flag=serve_flag)


def check_exposure(host: str, token: str | None) -> None:
    from elmo_model.errors import ElmoUserError

    if host not in LOOPBACK and not token:
        raise ElmoUserError(f"--host {host} lets other machines in: give --token TOKEN (or "
                            f"set {TOKEN_ENV}), or keep the default 127.0.0.1")


def run_serve(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError

    check_exposure(args.host, args.token)
    if not 0 <= args.port <= 65535:
        raise ElmoUserError(f"--port must be 0..65535, not {args.port}")
    if not args.sql_timeout > 0:
        raise ElmoUserError("--sql-timeout must be more than 0 seconds")
    if args.sql_memory < MIN_SQL_MEMORY_MB:
        raise ElmoUserError(f"--sql-memory must be at least {MIN_SQL_MEMORY_MB} (MB), not "
                            f"{args.sql_memory}")
    if args.replicas < 1:
        raise ElmoUserError(f"--replicas must be at least 1, not {args.replicas}")
    shard_actors(args)  # checked before the dataset is read
    if not args.no_verify:
        from schemas.verify import require_intact

        require_intact(args.dataset)
    if args.ray_address:
        return _run_on_ray(args)
    import uvicorn

    from pipeline.lookup.serve.app import create_app
    from pipeline.lookup.serve.resources import ServedStore

    store = ServedStore.open(args.dataset, args.index, args.model, args.sql_timeout,
                             check_files=not args.no_verify, sql_memory_mb=args.sql_memory)
    app = create_app(store, args.token)
    where = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving {args.dataset} ({len(store.indexes)} index(es)) at "
          f"http://{where}:{args.port}/  (API: /docs; Ctrl-C stops)", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=2)
    return 0


def _run_on_ray(args: argparse.Namespace) -> int:
    from pipeline.lookup.serve.ray_app import ReplicaSettings, deploy, wait_until_interrupted
    from pipeline.lookup.serve.resources import index_name

    # Paths as every replica sees them, whatever directory it starts in.
    indexes = [f"{name}={os.path.abspath(uri) if '://' not in uri else uri}"
               for name, uri in map(index_name, args.index)]
    dataset = args.dataset if "://" in args.dataset else os.path.abspath(args.dataset)
    settings = ReplicaSettings(dataset, indexes, args.model, args.sql_timeout, args.token,
                               sql_memory_mb=args.sql_memory)
    scatter, actors = shard_actors(args)
    searchers = deploy(settings, args.ray_address, args.replicas, args.host, args.port,
                       shard_actors=actors, scatter=scatter)
    held = "".join(f", index {name}: {len(ivf.actors)} shard actor(s) on "
                   f"{len(set(ivf.nodes))} node(s)"
                   for name, ivf in settings.searchers.items())
    print(f"serving {args.dataset} on Ray Serve ({args.replicas} replica(s){held}) at "
          f"http://{args.host}:{args.port}/  (Ctrl-C stops)", file=sys.stderr, flush=True)
    wait_until_interrupted(searchers)
    return 0


def shard_actors(args: argparse.Namespace) -> tuple[bool, int | None]:
    """``--shard-actors``: whether to scatter, and to how many actors (None: one per
    node)."""
    from elmo_model.errors import ElmoUserError

    value = args.shard_actors
    if value is None:
        return False, None
    if not args.ray_address:
        raise ElmoUserError("--shard-actors needs --ray-address (auto, HOST:PORT or local)")
    if value == "auto":
        return True, None
    if not value.isdigit() or int(value) < 1:
        raise ElmoUserError(f"--shard-actors must be auto or a number of at least 1, not "
                            f"{value!r}")
    return True, int(value)
