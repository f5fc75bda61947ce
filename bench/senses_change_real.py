"""Which words changed, measured on real change: the commit messages of IPython
(github.com/ipython/ipython, 2005-2026), whose documented history (its "what's new" pages
in docs/source/whatsnew/, quoted in ``KNOWN_CHANGES``) names the renames, new subsystems
and services that changed what some words mean in its commit messages.

    M=/work/.mirror/ipython+ipython/repo   # `fetch github:ipython/ipython`
    .venv/bin/python bench/senses_change_real.py prepare --mirror $M --work W
    nice .venv/bin/python bench/senses_change_real.py embed --work W    # elmo embed, default model
    .venv/bin/python bench/senses_change_real.py index --work W
    .venv/bin/python bench/senses_change_real.py measure --work W      # the table

The list of known changes and stable controls below was committed before the benchmark
was first run (git history shows it): nothing in it was chosen from a ranking.

Corpus: one document per commit reachable from any ref of the mirror (``git log --all``),
its subject and body (``git-svn-id`` lines dropped: repository metadata, not language),
with fields ``year`` and ``date`` (author date), all commits but 40% of the busiest years
(2010-2014). Ranked with ``--by year --bin 5``.

Reported per method and score: the share of the top 25 that are real changes (judged
from each word's uses, the judgement written in ``JUDGED``; words not judged yet are
listed for judging), how many of the corpus's 100 most frequent words reach the top 25,
each known change's rank among all ranked words, the stable controls' ranks, and the
Spearman correlation of the score with log uses over every ranked word.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BY, BIN = "year", 5
TOP = 25

# word -> the evidence, from IPython's own documentation (docs/source/whatsnew/ of the
# mirror) and history: what the word meant in its commit messages before, and after.
KNOWN_CHANGES: dict[str, str] = {
    "kernel": "2005-09: IPython1's Twisted-based parallel `IPython.kernel` (engines, "
              "controller); from 0.11 (2011) the ZeroMQ kernel that a frontend talks to "
              "(version0.11.rst: 'The Twisted-based IPython.kernel has been removed', 'one "
              "IPython kernel'); from 4.0 (2015) ipykernel, another package "
              "(version4.rst: 'IPython.kernel (now jupyter_client and ipykernel)')",
    "notebook": "2010-14: the HTML notebook developed in this repository (version0.12.rst); "
                "from 4.0 (2015) the Jupyter notebook, a separate project IPython runs "
                "inside (version4.rst, 'the Big Split')",
    "widget": "2010-12: the Qt console's widgets (ConsoleWidget, FrontendWidget; "
              "version0.11.rst); from 2.0 (2014) the notebook's interactive widgets "
              "(version2.0.rst: 'Interactive widgets'), moved out to ipywidgets in 4.0",
    "prompt": "before 5.0: the prompt strings and their templates (readline terminal); from "
              "5.0 (2016) prompt_toolkit, the library of the new terminal "
              "(version5.rst: 'prompt_toolkit')",
    "traitlets": "before 4.0: the module IPython.utils.traitlets; from 4.0 (2015) the "
                 "separate traitlets package (version4.rst, the Big Split; "
                 "version0.11.rst lists `traitlets.HasTraits` under the config system)",
    "actions": "before 2020: actions in general (Qt actions, user actions); from 2020 the "
               "CI service GitHub Actions (version7.rst: 'We moved to GitHub actions away "
               "from Travis-CI')",
    "main": "before 2021: main as an adjective or main() / mainloop; from 2021 the name of "
            "the default branch (version7.rst: 'The main branch of IPython', where older "
            "notes say 'the master branch')",
}
# Words whose use in commit messages the documented history gives no reason to change.
STABLE_CONTROLS: list[str] = ["typo", "string", "function", "file", "error", "windows",
                              "documentation", "import", "magic", "test"]
# Top-25 words judged from their uses (`elmo senses change WORD`): word -> (real change?,
# why). Filled in after a run, for the words the rankings put in their top 25.
# "Real" means the word's meaning or main referent changed (a rename, a new tool or service,
# a new API); a shift in a bot's or merge template's wording, a topic becoming more or less
# frequent (the same meaning) and tokenizer fragments are not. Judged 2026-11-29 from 3
# random lines a period per word (the corpus, after the first run).
JUDGED: dict[str, tuple[bool, str]] = {
    "main": (True, "main thread / main docstring, then the default branch ('Merge branch "
                   "main into ...')"),
    "kernel": (True, "IPython1's parallel kernel, then the ZeroMQ kernel, then ipykernel"),
    "notebook": (True, "the in-repository notebook, then the separate Jupyter notebook"),
    "changelog": (True, "the ChangeLog file of the svn years, then GitHub release notes' "
                        "'Full Changelog' and the what's-new pages"),
    "mark": (True, "marking a release ('Mark 0.7.2 version'), then pytest.mark"),
    "components": (True, "the Component configuration classes of 0.10, then URL and Codecov "
                         "components"),
    "pull": (False, "the 'Merge pull request #N from user/branch' template, then links in "
                    "bots' release notes"),
    "request": (False, "the merge-commit template ('Merge pull request')"),
    "merge": (False, "svn merges, then the GitHub merge-commit template"),
    "from": (False, "function word; the merge-commit template"),
    "branch": (False, "hand merges of svn branches, then the backport bot's 'on branch 7.x'"),
    "x": (False, "'OS X', then version branches '7.x' in the backport bot's template"),
    "patch": (False, "emailed patches, then 'patch-1' branch names in the merge template"),
    "redirect": (False, "I/O redirection, then redirect.github.com links in bots' notes"),
    "r": (False, "a tokenizer fragment (%r, re-)"),
    "nose": (False, "the same test runner, used then removed (topic)"),
    "mention": (False, "generic"), "condition": (False, "generic (race condition)"),
    "description": (False, "generic"), "convert": (False, "topic: nbconvert, then test "
                                                           "conversions"),
    "pin": (False, "pinning versions throughout"), "refactor": (False, "generic"),
    "thread": (False, "threads throughout (topic)"), "image": (False, "images; HTML img "
                                                                      "tags in PR bodies"),
    "app": (False, "applications and apply, mixed"), "generated": (False, "generic"),
    "token": (False, "tokenize throughout (topic)"),
    "traitlets": (True, "IPython.utils.traitlets, then the separate traitlets package"),
    "connection": (False, "kernel connection files, then database connections (topic)"),
    "oinspect": (False, "the same module throughout"), "local": (False, "generic"),
    "log": (False, "logging throughout"),
    "modified": (False, "generic; pasted `git status` lines"),
    **{w: (False, "function word, or a word of the commit templates (names, trailers)")
       for w in ("carreau", "noreply", "to", "fix", "don't", "update", "on", "into",
                 "remove", "add", "for", "use", "typo", "of", "co-authored-by", "pr",
                 "test", "new", "closes", "the", "backport", "and", "ipython")},
}

SVN_ID = re.compile(r"^git-svn-id:.*$", re.MULTILINE)


def prepare(mirror: str, work: Path, keep: float, seed: int) -> None:
    """The JSONL corpus: one document per commit, with its year and date; of the years
    2010-2014, which hold 60% of the commits, a random ``keep`` share (to bound the
    embedding time on a shared CPU; the other years keep every commit)."""
    import random

    rng = random.Random(seed)
    log = subprocess.run(["git", "--git-dir", mirror, "log", "--all",
                          "--format=%H%x1f%ad%x1f%B%x1e", "--date=format:%Y-%m-%d"],
                         check=True, capture_output=True, text=True).stdout
    out, words = [], 0
    for record in log.split("\x1e"):
        parts = record.strip("\n").split("\x1f")
        if len(parts) != 3:
            continue
        commit, date, message = parts
        text = SVN_ID.sub("", message).strip()
        if not text or (2010 <= int(date[:4]) <= 2014 and rng.random() >= keep):
            continue
        words += len(text.split())
        out.append({"doc_id": commit[:12], "year": int(date[:4]), "date": date,
                    "text": text})
    work.mkdir(parents=True, exist_ok=True)
    (work / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    years = Counter(r["year"] // BIN * BIN for r in out)
    print(f"{len(out)} commits, {words} words; per {BIN} years: "
          + ", ".join(f"{y}: {n}" for y, n in sorted(years.items())))


def embed(work: Path) -> None:
    """`elmo embed` with its default settings (the default model)."""
    started = time.time()
    subprocess.run([str(REPO / ".venv/bin/elmo"), "embed", str(work / "corpus.jsonl"),
                    "--out", str(work / "ds")], check=True)
    print(f"embedded in {time.time() - started:.0f} s")


def index(work: Path) -> None:
    """`elmo index build` with its default settings."""
    if not (work / "ix" / "_elmo_index.json").exists():
        subprocess.run([str(REPO / ".venv/bin/elmo"), "index", "build", str(work / "ds"),
                        "--out", str(work / "ix")], check=True)


def _frequent(ix_path: str, n: int = 100) -> set[str]:
    """The corpus's ``n`` most frequent words (stems, letters only), by the index's counts."""
    from pipeline.lookup.index.sense_index import SenseIndex
    from pipeline.lookup.senses.clusters import WORD_RE

    counts = SenseIndex(ix_path).word_counts.table()
    by_stem: Counter[str] = Counter()
    for stem, rows in zip(counts.column("token_stem").to_pylist(),
                          counts.column("rows").to_pylist(), strict=True):
        if stem and WORD_RE.fullmatch(stem):
            by_stem[stem] += rows
    return {w for w, _ in by_stem.most_common(n)}


def _orders(rows: list[dict], method: str) -> dict[str, list[dict]]:
    """Scoring -> every ranked row, best first."""
    def by(key: str, significant_first: bool) -> list[dict]:
        def order(r: dict) -> tuple:
            v = r[key]
            return ((not r["significant"]) if significant_first else False,
                    -v if v is not None and math.isfinite(v) else math.inf, r["word"])
        return sorted(rows, key=order)

    return {f"{method} excess, significant first": by(f"{method}_excess", True),
            f"{method} excess": by(f"{method}_excess", False),
            f"{method} z": by(f"{method}_z", False)}


def _metrics(ranked: list[dict], key: str, frequent: set[str]) -> dict:
    from scipy.stats import spearmanr

    from pipeline.lookup.index.words import stem_words

    top = [r["word"] for r in ranked[:TOP]]
    # A known change is a real one wherever it ranks.
    judged = [w in KNOWN_CHANGES or JUDGED[w][0] for w in top
              if w in JUDGED or w in KNOWN_CHANGES]
    position = {r["word"]: i + 1 for i, r in enumerate(ranked)}
    stems = {w: s for w, s in zip(position, stem_words(list(position)), strict=True)}
    known = {w: position.get(w) or next((position[f] for f, s in stems.items()
                                          if s == stem_words([w])[0]), None)
             for w in KNOWN_CHANGES}
    ranks = sorted(r for r in known.values() if r is not None)
    values = [(r[key], math.log(sum(r["uses"].values()))) for r in ranked
              if r[key] is not None and math.isfinite(r[key])]
    return {"top": top, "real_in_top": sum(judged), "judged_in_top": len(judged),
            "unjudged": [w for w in top if w not in JUDGED and w not in KNOWN_CHANGES],
            "frequent_in_top": sorted(stems[w] for w in top if stems[w] in frequent),
            "known_ranks": known, "known_median": float(np.median(ranks)) if ranks else None,
            "controls": {w: position.get(w) for w in STABLE_CONTROLS},
            "ranked": len(ranked), "spearman_log_uses": float(
                spearmanr(*zip(*values, strict=True)).statistic)}


def measure(work: Path, methods: list[str], label: str) -> None:
    """Rank with each method (this checkout's code), then every scoring's metrics."""
    from pipeline.lookup.senses.change import word_changes

    frequent = _frequent(str(work / "ix"))
    results = {}
    for method in methods:
        started = time.time()
        ranking = word_changes(str(work / "ix"), BY, BIN, method=method, progress=True)
        took = time.time() - started
        rows = [r.to_dict() for r in ranking.rows]
        for r in rows:
            r.setdefault("significant", True)  # code from before significance
        (work / f"rows-{label}-{method}.json").write_text(json.dumps(rows) + "\n")
        for scoring, ranked in _orders(rows, method).items():
            key = scoring.split(",")[0].replace(" ", "_")
            results[scoring] = {**_metrics(ranked, key, frequent), "seconds": round(took),
                                "significant": sum(bool(r.get("q") is not None and
                                                        r["significant"]) for r in rows)}
            m = results[scoring]
            print(f"{label} | {scoring}: real {m['real_in_top']}/{m['judged_in_top']} judged "
                  f"of top {TOP}; frequent in top {len(m['frequent_in_top'])} "
                  f"{m['frequent_in_top']}; known median {m['known_median']} of "
                  f"{m['ranked']} {m['known_ranks']}; Spearman(log uses) "
                  f"{m['spearman_log_uses']:.2f}; significant {m['significant']}; "
                  f"{took:.0f} s\n  top: {', '.join(m['top'])}\n  unjudged: "
                  f"{', '.join(m['unjudged'])}\n  controls: {m['controls']}", flush=True)
    (work / f"results-{label}.json").write_text(json.dumps(results, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("prepare", "embed", "index", "measure"))
    parser.add_argument("--work", required=True, type=Path, help="working folder")
    parser.add_argument("--mirror", help="the project's git directory (prepare)")
    parser.add_argument("--keep", type=float, default=0.4,
                        help="share of the 2010-2014 commits kept (prepare)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="prt,apd,jsd,ed",
                        help="methods to rank by (measure)")
    parser.add_argument("--label", default="after", help="names the results (measure)")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="rank with the code of this checkout (measure; e.g. `git "
                             "archive 5d03788 | tar -x -C DIR` for the code before issue 45)")
    args = parser.parse_args()
    if args.stage == "prepare":
        if not args.mirror:
            parser.error("prepare needs --mirror GIT_DIR")
        prepare(args.mirror, args.work, args.keep, args.seed)
    elif args.stage == "embed":
        embed(args.work)
    elif args.stage == "index":
        index(args.work)
    else:
        measure(args.work, args.methods.split(","), args.label)


if __name__ == "__main__":
    code = sys.argv[sys.argv.index("--code") + 1] if "--code" in sys.argv else str(REPO)
    sys.path.insert(0, code)
    np.seterr(all="ignore")
    main()
