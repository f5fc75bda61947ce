"""``elmo demo``: the tour ``make run`` gives a newcomer, with the commands they can reuse.

Each step prints the ``elmo`` command it runs and then runs exactly that, through the
same dispatcher a user's shell reaches, so the demo cannot drift from the real CLI.
Rerunning it is cheap: the dataset's committed shards and the index are reused. A demo
folder made with another model (a pulled new ``models/default``) is made again, since a
dataset never mixes two models' vectors; only the demo's own folders are removed (the
default one, or one holding the mark a demo leaves).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

DESCRIPTION = """\
The tour `make run` gives: embed the bundled sample corpus with the bundled model, index it,
query it with SQL, search word senses in context and draw a sense map. Each step prints
the elmo command it runs, so you can rerun or adapt it; rerunning the demo reuses the
dataset and the index, or makes them again when they came from another model (after a
pull that brought a new models/default).
"""

EPILOG = """\
writes: DIR/dataset (Parquet, every layer), DIR/index (LanceDB), DIR/play.png (sense map
picture) and DIR/play.html (interactive sense map: open it in a browser).

examples:
  elmo demo                         # sample corpus -> runs/demo/
  elmo demo --out /tmp/elmo-demo --corpus 'data/sample/play.txt'
  elmo demo --model runs/my-model   # the same tour with your own model
"""
MAP_WORD = "play"  # the sample corpus gathers its uses (data/sample/play.txt)
DEMO_MARK = ".elmo-demo"  # left in a demo's --out: its dataset and index are the demo's own


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="the tour: embed the sample corpus, index it, SQL, sense search and map",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(default_out()), metavar="DIR",
                   help="where the dataset, index and sense maps go (default runs/demo)")
    p.add_argument("--corpus", default=str(_repo_root() / "data" / "sample" / "*.txt"),
                   metavar="GLOB", help="text files to embed (default data/sample/*.txt)")
    p.add_argument("--model", metavar="DIR", help="model directory (default models/default)")
    p.set_defaults(handler=run_demo)


def map_files(out: Path) -> tuple[Path, Path]:
    """Where the demo's sense maps go: ``(png, html)``."""
    return out / f"{MAP_WORD}.png", out / f"{MAP_WORD}.html"


def demo_steps(out: Path, corpus: str, model: str | None) -> list[tuple[str, list[str]]]:
    dataset, index = str(out / "dataset"), str(out / "index")
    png, html = map_files(out)
    model_args = ["--model", model] if model else []
    return [
        ("Embed the corpus: tokenize, run the biLM, store all 3 layers of every token "
         "(int8 Parquet with a scale per vector, hive-partitioned by shard)",
         ["embed", corpus, "--out", dataset, *model_args]),
        ("Index the top layer in LanceDB for contextual-sense search",
         ["index", "build", dataset, "--mix", "top", "--out", index]),
        ("SQL over the stored tokens with DuckDB",
         ["sql", dataset, "SELECT lower(token) AS word, count(*) AS n, "
          "count(DISTINCT doc_id) AS documents FROM tokens "
          "WHERE lower(token) IN ('play', 'bank', 'fair', 'light') GROUP BY 1 ORDER BY n DESC"]),
        ("SQL with the mix functions: the occurrences of 'play' nearest the first one, "
         "by cosine of their top-layer vectors",
         ["sql", dataset,
          "WITH q AS (SELECT elmo_mix(layer_0, layer_1, layer_2, 'top') AS v FROM tokens "
          "WHERE lower(token) = $w ORDER BY doc_id, sent_idx, tok_idx LIMIT 1) "
          "SELECT t.doc_id, t.sent_idx, t.tok_idx, t.token, "
          "round(elmo_cosine(elmo_mix(t.layer_0, t.layer_1, t.layer_2, 'top'), q.v), 3) AS sim "
          "FROM tokens t, q WHERE lower(t.token) = $w ORDER BY sim DESC LIMIT 5",
          "--param", "w=play"]),
        ("Sense search: the uses of play, plays, played nearest 'plays' in a music sentence "
         "(word forms match; --any-word would search every word). The small bundled model "
         "tells the verb from the noun better than music from acting: compare the next search",
         ["senses", "search", "He plays the guitar in a band", "--word", "plays", "-k", "5",
          "--index", index, *model_args]),
        ("Sense search: 'play' as a piece for the theatre",
         ["senses", "search", "They went to London to see the new play at the theatre .",
          "--word", "play", "-k", "5", "--index", index, *model_args]),
        (f"Sense map: the uses of '{MAP_WORD}' clustered into senses, drawn as a picture "
         "and as an interactive page",
         ["senses", "cluster", MAP_WORD, "--index", index, "--plot", str(png),
          "--html", str(html)]),
    ]


def default_out() -> Path:
    return _repo_root() / "runs" / "demo"


def made_with_another_model(out: Path, model: str | None) -> bool:
    """Whether ``out``'s dataset was embedded with another model than the one the demo
    runs now (False when there is none, or the model cannot be read: the embed step then
    says why)."""
    from elmo_model.errors import ElmoUserError
    from elmo_model.options_file import model_fingerprint
    from pipeline.write.config import ModelSpec
    from schemas import DESCRIPTOR_FILE
    from schemas.dataset import read_dataset_descriptor

    if not (out / "dataset" / DESCRIPTOR_FILE).is_file():
        return False
    try:
        spec = ModelSpec.resolve(model)  # the model files the embed step will read
        current = model_fingerprint(spec.options, spec.weights)
        stored = read_dataset_descriptor(str(out / "dataset")).model_fingerprint
    except (OSError, ElmoUserError):
        return False
    return stored != current


def run_demo(args: argparse.Namespace) -> int:
    from elmo_model.errors import ElmoUserError
    from pipeline.cli import main

    out = Path(args.out)
    owned = (out / DEMO_MARK).is_file() or out.resolve() == default_out().resolve()
    if owned and made_with_another_model(out, args.model):
        print(f"{out} was made with another model: making its dataset and index again",
              flush=True)
        for folder in (out / "dataset", out / "index"):
            shutil.rmtree(folder, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for number, (title, argv) in enumerate(demo_steps(out, args.corpus, args.model), 1):
        print(f"\n== {number}. {title}\n$ elmo {shlex.join(argv)}", flush=True)
        status = main(argv)
        if status != 0:
            raise ElmoUserError(f"demo step {number} failed (exit {status}): elmo "
                                f"{shlex.join(argv)}")
    (out / DEMO_MARK).touch()  # made by a whole demo run: a later one may make it again
    png, html = map_files(out)
    print(f"\ndemo done in {time.perf_counter() - started:.0f} s; in {out}/:\n"
          f"  dataset   {out / 'dataset'}   (try `elmo sql {out / 'dataset'} "
          f"\"SELECT * FROM sentences LIMIT 5\"`)\n"
          f"  index     {out / 'index'}\n"
          f"  sense map {png}   (picture)\n"
          f"  sense map {html}   (interactive: open it in a browser, hover a dot)\n"
          f"\nexplore it in a browser: `elmo serve {out / 'dataset'} --index {out / 'index'}`, "
          "then open http://127.0.0.1:8000/")
    return 0
