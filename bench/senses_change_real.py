"""Which words changed, measured on real change: the commit messages of IPython
(github.com/ipython/ipython, 2005-2026), whose documented history (its "what's new" pages
in docs/source/whatsnew/, quoted in ``KNOWN_CHANGES``) names the renames, new subsystems
and services that changed what some words mean in its commit messages.

    .venv/bin/python bench/senses_change_real.py prepare --mirror /work/.mirror/ipython+ipython/repo --work W
    nice .venv/bin/python bench/senses_change_real.py embed --work W    # elmo embed, default model
    .venv/bin/python bench/senses_change_real.py index --work W
    .venv/bin/python bench/senses_change_real.py measure --work W      # the table

The list of known changes and stable controls below was committed before the benchmark
was first run (git history shows it): nothing in it was chosen from a ranking.

Corpus: one document per commit reachable from any ref of the mirror (``git log --all``),
its subject and body (``git-svn-id`` lines dropped: repository metadata, not language),
with fields ``year`` and ``date`` (author date). Ranked with ``--by year --bin 5``.

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
JUDGED: dict[str, tuple[bool, str]] = {}

SVN_ID = re.compile(r"^git-svn-id:.*$", re.MULTILINE)


def prepare(mirror: str, work: Path) -> None:
    """The JSONL corpus: one document per commit, with its year and date."""
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
        if not text:
            continue
        words += len(text.split())
        out.append({"doc_id": commit[:12], "year": int(date[:4]), "date": date,
                    "text": text})
    work.mkdir(parents=True, exist_ok=True)
    (work / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    years = Counter(r["year"] // BIN * BIN for r in out)
    print(f"{len(out)} commits, {words} words; per {BIN} years: "
          + ", ".join(f"{y}: {n}" for y, n in sorted(years.items())))
