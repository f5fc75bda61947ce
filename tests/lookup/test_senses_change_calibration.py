"""`elmo senses change`'s score and significance: calibrated so that frequency does not
decide the ranking, p-values not stuck at their floor, Benjamini-Hochberg q-values as
a reference computes them, and repeated contexts counted once. A real corpus embedded
with the bundled default model, indexed in LanceDB on disk.

Every sentence here is distinct. "bank" means money in the 1900s and a river's edge in
the 2000s (24 contexts a century); "garden" is used the same way throughout, with ten
times the uses (240 a century); "notice" is a boilerplate sentence repeated in 30
documents of each century, plus a few distinct uses.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from helpers import REPO

from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

NAMES = ("Ada", "Ben", "Cora", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jo", "Kit", "Lea")
MONEY = ("{n} paid her savings into the bank on Monday.",
         "{n} borrowed money from the bank to buy a house.")
RIVER = ("{n} sat on the grassy bank of the river and fished.",
         "{n} pulled the boat up onto the muddy bank of the stream.")
GARDEN = ("{n} planted {a} roses in the garden.", "{n} watered the {a} garden at dusk.",
          "{n} walked through the {a} garden after lunch.",
          "{n} read a book in the {a} garden.", "{n} picked {a} beans in the garden.")
ADJECTIVES = ("red", "white", "small", "tall")
NOTICE = "This notice is printed in every letter of the series."
PER_CENTURY = 60  # documents


def _records() -> list[dict]:
    records = []
    for late in (False, True):
        names = [f"{n} Ray" if late else n for n in NAMES]  # no sentence in both
        bank = [t.format(n=n) for t, n in itertools.product(RIVER if late else MONEY,
                                                            names)]
        garden = [t.format(n=n, a=a) for t, n, a in itertools.product(GARDEN, names,
                                                                     ADJECTIVES)]
        for i in range(PER_CENTURY):
            year = (2001 if late else 1901) + i % 50
            text = [*(bank[i::PER_CENTURY]), *garden[i::PER_CENTURY]]
            if i < 30:
                text.append(NOTICE)
            if i < 3:  # a few distinct uses of "notice"
                text.append(f"{NAMES[i + 3 * late]} did not notice the {ADJECTIVES[i]} cat.")
            records.append({"id": f"{'late' if late else 'early'}/{i:02d}",
                            "text": " ".join(text), "year": year})
    return records


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> str:
    from pipeline.lookup.index.build import build_index

    folder = tmp_path_factory.mktemp("change_calibration")
    corpus = folder / "letters.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    embed_corpus(EmbedConfig(sources=[str(corpus)], out=str(folder / "ds"),
                             model=ModelSpec.resolve(str(REPO / "models" / "default")),
                             min_items=2, progress=False, executor="local"))
    build_index(str(folder / "ds"), "top", str(folder / "ix"), kind="flat", compact=False)
    return str(folder / "ix")


def _ranking(index: str, **kw: object) -> object:
    from pipeline.lookup.senses.change import word_changes

    kw.setdefault("min_uses", 10)
    return word_changes(index, "year", 100, **kw)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_stable_word_of_ten_times_the_uses_does_not_outrank_a_changed_one(
        index: str) -> None:
    ranking = _ranking(index, words=["bank", "garden"])
    bank, garden = (next(r for r in ranking.rows if r.word == w) for w in ("bank", "garden"))
    assert sum(bank.uses.values()) == 48 and sum(garden.uses.values()) == 480
    assert bank.rank == 1 and garden.rank == 2
    # "garden"'s contexts shift a little (other names in the late letters): with 480
    # uses that small shift is sure, but it is small, and change says how much.
    assert bank.significant and bank.q <= 0.05
    assert bank.change > 5 * abs(garden.change)
    by_z = _ranking(index, words=["bank", "garden"], score="z")
    assert [r.change for r in by_z.rows] == [r.z["prt"] for r in by_z.rows]


@pytest.mark.slow
def test_p_values_get_enough_shuffles_to_leave_their_floor(index: str) -> None:
    from pipeline.lookup.senses.change_significance import max_shuffles

    ranking = _ranking(index, resamples=50)
    bank = next(r for r in ranking.rows if r.word == "bank")
    most = max_shuffles(ranking.candidates, 50)
    # Clearly changed: more than the first 50 shuffles, and p under 1/51.
    assert bank.shuffles > 50 and bank.p < 1 / 51
    assert bank.p >= 1 / (most + 1) and bank.shuffles <= most
    assert all(50 <= r.shuffles <= most for r in ranking.rows)
    # Significant words first, by change, then the rest, by change.
    flags = [r.significant for r in ranking.rows]
    assert flags == sorted(flags, reverse=True) and ranking.significant == sum(flags)
    for part in (True, False):
        changes = [r.change for r in ranking.rows if r.significant == part]
        assert changes == sorted(changes, reverse=True)


@pytest.mark.slow
def test_a_repeated_sentence_counts_once_in_each_group(index: str) -> None:
    from pipeline.lookup.senses.over_time import sense_timeline

    ranking = _ranking(index, words=["notice"], min_uses=2)
    notice = ranking.rows[0]
    # 30 documents a century print the notice: one context there, plus the 3 others.
    assert notice.uses == {"1900-1999": 4, "2000-2030": 4} and notice.documents == 60
    assert ranking.repeats == 2 * 29
    timeline = sense_timeline(index, "notice", "year", 100, k=2)
    assert [r.total for r in timeline.breakdown.rows] == [4, 4]


def test_shuffles_stop_once_enough_reach_the_observed_score() -> None:
    from pipeline.lookup.senses.change_scores import Blocks, resampled_scores
    from pipeline.lookup.senses.change_significance import MIN_EXCEEDING, refined_p

    rng = np.random.default_rng(2)
    sums = rng.normal(size=(12, 8))
    blocks = Blocks(np.array([0, 6]), sums, np.full(12, 3.0), np.ones((12, 1)))
    def draw(n: int) -> np.ndarray:
        return resampled_scores(blocks, np.array([rng.permutation(12) for _ in range(n)]))[
            "prt"]

    null = draw(50)
    # An ordinary score: the first 50 shuffles reach it often enough.
    typical = float(np.median(null))
    assert refined_p(draw, typical, null, 5_000)[1] == 50
    # A score no shuffle reaches: rounds of 10x, to the most allowed.
    p, drawn = refined_p(draw, 10.0, null, 5_000)
    assert drawn == 5_000 and p == pytest.approx(1 / 5_001)
    # One that a few reach: more shuffles until MIN_EXCEEDING do.
    rare = float(np.quantile(null, 0.97))
    p, drawn = refined_p(draw, rare, null, 50_000)
    assert 50 < drawn < 50_000 and p * (drawn + 1) >= MIN_EXCEEDING + 1


def test_bh_q_values_equal_a_reference_computation() -> None:
    from pipeline.lookup.senses.change_significance import bh_qvalues

    rng = np.random.default_rng(5)
    p = np.r_[rng.uniform(0, 0.01, 20), rng.uniform(0, 1, 200), [np.nan, 0.5, 0.5]]
    q = bh_qvalues(p)
    # Reference: the definition, q_i = min over p_j >= p_i of m p_j / rank_j, by loops.
    tested = [v for v in p if np.isfinite(v)]
    m = len(tested)
    ranked = sorted(tested)
    for i, value in enumerate(p):
        if not np.isfinite(value):
            assert np.isnan(q[i])
            continue
        want = min(min(1.0, m * ranked[j] / (j + 1)) for j in range(m) if ranked[j] >= value)
        assert q[i] == pytest.approx(want, rel=1e-12)
    # Ties share a q; q never falls below p; the order of p is kept.
    assert q[-1] == q[-2] and np.all(q[np.isfinite(p)] >= p[np.isfinite(p)])
    order = np.argsort(p[np.isfinite(p)], kind="stable")
    assert np.all(np.diff(q[np.isfinite(p)][order]) >= 0)
    assert np.isnan(bh_qvalues(np.array([np.nan]))).all() and bh_qvalues(np.array([])).size == 0


def test_distinct_rows_keep_each_sentence_once_per_group() -> None:
    import pyarrow as pa

    from pipeline.lookup.senses.contexts import distinct_rows

    keys = pa.table({"doc_id": ["b", "a", "c", "d", "e", "f"],
                     "sent_idx": [0, 0, 0, 1, 0, 0], "tok_idx": [1, 1, 2, 1, 1, 1],
                     "sentence": ["We  play here.", "We play\nhere.", "We play here.",
                                  "We play here.", None, None]})
    group = np.array([0, 0, 0, 1, 0, 0])
    # a and b: one context (a first); c: another token; d: another group; no text: each.
    assert distinct_rows(keys, None, group).tolist() == [False, True, True, True, True, True]
