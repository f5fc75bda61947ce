"""The two sense searches of ``elmo demo`` for one model, scored with hand labels.

    PYTHONPATH=$PWD .venv/bin/python bench/demo_searches.py models/default
    PYTHONPATH=$PWD .venv/bin/python bench/demo_searches.py /tmp/v2model --out /tmp/demo-v2

Builds the demo's dataset and index (the demo's own embed and index steps, from
``pipeline.demo.demo_steps``, on ``data/sample/*.txt``) in a scratch directory, runs its
two searches (music: "He plays the guitar in a band", theatre: the play at the
theatre) and prints each top ``-k`` with a label per hit: music, theatre, game or other,
from ``bench/demo_play_labels.tsv``. A hit is keyed by file, line and the character
offset of the word in that line, so the label holds whether the model's tokenizer cuts
the line into one sentence or several. The score: music uses in the music query's top k,
theatre uses in the theatre query's top k. Hits deeper than k (to ``--pool``) without a
label are listed, to be labelled by hand.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABELS_FILE = Path(__file__).resolve().parent / "demo_play_labels.tsv"
LABELS = ("music", "theatre", "game", "other")
# which label each search wants, by the word it searches for
WANTED = {"plays": "music", "play": "theatre"}


def read_labels(path: Path = LABELS_FILE) -> dict[tuple[str, int, int], str]:
    """``(file name, line, char offset in the line) -> label``."""
    labels = {}
    with open(path, encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            if row["label"] not in LABELS:
                raise ValueError(f"{path}: unknown label {row['label']!r} ({LABELS})")
            labels[(row["file"], int(row["line"]), int(row["start"]))] = row["label"]
    return labels


def line_offset(line_text: str, sentence: str, start_in_sentence: int) -> int:
    """Character offset in its line of a word at ``start_in_sentence`` in ``sentence``,
    a sentence cut from that line (the whole line, or a part of it)."""
    at = line_text.find(sentence)
    if at < 0:  # whitespace differs: match on the text before the word instead
        before = " ".join(sentence[:start_in_sentence].split())
        flat = " ".join(line_text.split())
        at = flat.find(before) + len(before)
        return at + (1 if before else 0) - (len(flat) - len(line_text))
    return at + start_in_sentence


def hit_key(hit, sample_dir: Path) -> tuple[str, int, int]:
    name = Path(str(hit.fields["source"])).name
    lines = (sample_dir / name).read_text(encoding="utf-8").split("\n")
    line = int(hit.fields["line"])
    return name, line, line_offset(lines[line - 1], hit.sentence, hit.start)


def demo_queries() -> tuple[list[list[str]], list[tuple[str, str]]]:
    """The demo's build steps (embed, index) and its sense searches' (sentence, word)."""
    from pipeline.demo import demo_steps

    steps = [argv for _, argv in demo_steps(Path("OUT"), "CORPUS", "MODEL")]
    build = [argv for argv in steps if argv[0] in ("embed", "index")]
    searches = [(argv[2], argv[argv.index("--word") + 1]) for argv in steps
                if argv[:2] == ["senses", "search"]]
    return build, searches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--out", help="scratch directory (default /tmp/demo-eval-NAME)")
    parser.add_argument("--corpus", default=str(ROOT / "data" / "sample" / "*.txt"))
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--pool", type=int, default=10,
                        help="also list unlabelled hits down to this rank")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()

    import torch

    from pipeline.cli import main as elmo
    from pipeline.lookup.senses.search import search_senses

    torch.set_num_threads(1)
    model_dir = str(Path(args.model_dir).resolve())
    out = Path(args.out or f"/tmp/demo-eval-{Path(model_dir).name}")
    build, searches = demo_queries()
    started = time.perf_counter()
    swap = {"OUT/dataset": str(out / "dataset"), "OUT/index": str(out / "index"),
            "CORPUS": args.corpus, "MODEL": model_dir}
    for argv in build:
        status = elmo([swap.get(a, a) for a in argv])
        if status != 0:
            raise SystemExit(f"elmo {' '.join(argv)} failed ({status})")
    print(f"built {out} in {time.perf_counter() - started:.0f}s", flush=True)

    labels = read_labels()
    sample_dir = Path(args.corpus).parent
    results = {}
    for sentence, word in searches:
        hits = search_senses(str(out / "index"), sentence, word, k=max(args.k, args.pool),
                             model_dir=model_dir)
        wanted = WANTED[word]
        print(f"\n{sentence!r} --word {word} (wanted: {wanted})")
        rows = []
        for hit in hits:
            key = hit_key(hit, sample_dir)
            label = labels.get(key, "UNLABELLED")
            if hit.rank <= args.k or label == "UNLABELLED":
                print(f"  {hit.rank:2d} {hit.similarity:.3f} {label:10s} "
                      f"{key[0]}:{key[1]}:{key[2]} {hit.snippet(90)}")
            rows.append({"rank": hit.rank, "label": label, "key": list(key),
                         "sentence": hit.sentence})
        top = [r["label"] for r in rows[: args.k]]
        results[word] = {"wanted": wanted, "count": top.count(wanted), "top": rows}
        print(f"  {wanted} in top {args.k}: {top.count(wanted)}/{args.k}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
