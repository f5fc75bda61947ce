"""How differently a word is used across groups of documents, and how differently it
would be by chance: the three measures of Kutuzov & Giulianelli (SemEval-2020 Task 1),
over unit (cosine-geometry) vectors of the word's uses.

- ``prt``: the cosine distance between the groups' mean vectors;
- ``apd``: the average cosine distance between two uses from different groups, which for
  unit vectors is exactly ``1 - mean_g . mean_h`` (so it needs sums, not pairs);
- ``jsd``: the Jensen-Shannon divergence (bits) between the groups' distributions over
  the word's sense clusters (``elmo senses cluster``'s k-means of a sample of its uses);
- ``ed``: the energy distance between the groups' uses, ``2 apd - within_g - within_h``
  (within: the average distance between two uses of one group), which for unit vectors is
  ``|mean_g - mean_h|^2``: apd without the part that only says how varied the uses are
  inside each group (a word with two steady senses has a high apd and no change).

With more than two groups ``prt``, ``apd`` and ``ed`` average every pair of groups, and
``jsd`` is the generalised divergence of all the groups' distributions (equal weights).

Uses in one document are not independent, so documents, not uses, are resampled: each
group's documents are dealt into blocks (``Blocks``: a word's uses summed per block), and
both the null distribution (block labels shuffled across groups, each group keeping its
number of blocks) and the bootstrap interval (each group's blocks drawn with replacement)
resample whole blocks. A raw score is mostly sampling noise for a word with few uses (a
rare word's group means are far apart by chance), so ``change`` is the score less the mean
of its own null distribution (``excess``: how much more the groups differ than shuffled
ones would); its significance is the permutation p-value, corrected across words
(``change_significance``). The other way, the distance from the null in its standard
deviations (``WordScores.z``), says how sure rather than how much, and grows with the
square root of a word's uses: on real text it ranks the most frequent words first
(BENCHMARKS.md, issue 45).

Everything here is numpy on arrays already gathered (``senses.change`` reads them); the
resampled scores of one word are computed together, ``[resamples, groups, dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

METHODS = ("prt", "apd", "jsd", "ed")
# Chosen on bench/senses_change.py (docs/senses.md, "Which words changed").
DEFAULT_METHOD = "prt"
DEFAULT_MIN_USES = 20
# What ``change`` is: ``excess``, the raw score less its shuffled-groups null's mean (how
# much: a frequent word's small sure shift ranks low; chosen on bench/senses_change_real.py,
# where z put the function words on top), or ``z``, that distance in null standard
# deviations (how sure; grows with a word's uses).
SCORES = ("excess", "z")
DEFAULT_SCORE = "excess"
# Up to this many of a word's uses per group are kept (at random) to find its senses,
# fewer with many groups (``sense_sample``): memory is words x groups x this x dim.
SENSE_SAMPLE = 64
SENSE_SAMPLE_WORD = 128  # per word in all, at least SENSE_SAMPLE_MIN a group
SENSE_SAMPLE_MIN = 16


def sense_sample(groups: int) -> int:
    """Uses per (word, group) kept to find the word's senses."""
    return max(SENSE_SAMPLE_MIN, min(SENSE_SAMPLE, SENSE_SAMPLE_WORD // max(1, groups)))
MAX_SENSES = 8  # jsd's senses: as many as ``elmo senses cluster --k auto`` tries
USES_PER_SENSE = 4  # and at most one per this many sampled uses
INTERVAL = 0.95  # bootstrap interval's coverage


@dataclass
class Blocks:
    """One word's uses in its groups, summed per block of documents; blocks sorted by
    group, ``starts[g]`` the first block of group ``g``."""

    starts: np.ndarray  # [groups] first block of each group
    sums: np.ndarray  # [blocks, dim] sum of the unit vectors of the block's uses
    counts: np.ndarray  # [blocks] uses in the block
    senses: np.ndarray  # [blocks, k] sampled uses per sense cluster

    @property
    def n_blocks(self) -> int:
        return len(self.counts)

    def group_sizes(self) -> np.ndarray:
        return np.diff(np.r_[self.starts, self.n_blocks])


@dataclass
class WordScores:
    raw: dict[str, float]  # method -> observed score
    z: dict[str, float]  # method -> (raw - null mean) / null sd
    p: dict[str, float]  # method -> share of shuffles scoring at least as high (+1 smoothed)
    null_mean: dict[str, float]
    interval: dict[str, tuple[float, float]] = field(default_factory=dict)  # bootstrap
    shuffles: int = 0  # shuffles behind the ranked method's p (more when p was small)


def _pair_mean(matrix: np.ndarray) -> np.ndarray:
    """Mean of the off-diagonal upper triangle of ``[..., G, G]``."""
    g = matrix.shape[-1]
    upper = np.triu_indices(g, 1)
    return matrix[..., upper[0], upper[1]].mean(-1)


def _entropy_bits(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(-1)


def group_scores(dots: np.ndarray, counts: np.ndarray, senses: np.ndarray
                 ) -> dict[str, np.ndarray]:
    """Each method's score from per-group aggregates: ``dots [..., G, G]`` (the dot
    products of the groups' sums of unit vectors), ``counts [..., G]``, ``senses [..., G,
    k]``; a group without uses makes the score NaN. This is the reference every
    resampling goes through."""
    with np.errstate(divide="ignore", invalid="ignore"):
        empty = (counts <= 0).any(-1)
        norms = np.sqrt(np.maximum(np.diagonal(dots, axis1=-2, axis2=-1), 0.0))
        cos = dots / (norms[..., :, None] * norms[..., None, :])
        prt = _pair_mean(1.0 - cos)
        means = dots / (counts[..., :, None] * counts[..., None, :])  # mean_g . mean_h
        apd = _pair_mean(1.0 - means)
        own = np.diagonal(means, axis1=-2, axis2=-1)
        ed = _pair_mean(own[..., :, None] + own[..., None, :] - 2 * means)
        sampled = senses.sum(-1, keepdims=True)
        dist = senses / sampled
        jsd = _entropy_bits(dist.mean(-2)) - _entropy_bits(dist).mean(-1)
        jsd = np.where((sampled[..., 0] <= 0).any(-1), np.nan, jsd)
    return {"prt": np.where(empty, np.nan, prt), "apd": np.where(empty, np.nan, apd),
            "jsd": np.where(empty, np.nan, np.maximum(jsd, 0.0)),
            "ed": np.where(empty, np.nan, ed)}


def resampled_scores(blocks: Blocks, picks: np.ndarray) -> dict[str, np.ndarray]:
    """Scores when group ``g`` holds blocks ``picks[:, starts[g]:starts[g+1]]`` (block
    numbers; ``picks [R, blocks]``): ``[R]`` per method. Through the blocks' Gram matrix:
    a group's sum is ``a @ sums`` for its pick counts ``a``, so the groups' dot products
    are ``A K A^T`` (``K = sums sums^T``), without summing ``dim``-vectors per draw."""
    r = picks.shape[0]
    group = np.repeat(np.arange(len(blocks.starts)), blocks.group_sizes())  # [n]
    chosen = np.zeros((r, len(blocks.starts), blocks.n_blocks))
    np.add.at(chosen, (np.arange(r)[:, None], group[None, :], picks), 1.0)
    gram = blocks.sums @ blocks.sums.T
    dots = chosen @ gram @ np.swapaxes(chosen, -1, -2)
    return group_scores(dots, chosen @ blocks.counts, chosen @ blocks.senses)


def shuffled_picks(blocks: Blocks, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Block labels shuffled across groups (the null: group makes no difference)."""
    base = np.tile(np.arange(blocks.n_blocks), (resamples, 1))
    return rng.permuted(base, axis=1)


def bootstrap_picks(blocks: Blocks, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Each group's blocks drawn with replacement from its own."""
    ends = np.r_[blocks.starts[1:], blocks.n_blocks]
    return np.concatenate([rng.integers(lo, hi, size=(resamples, hi - lo))
                           for lo, hi in zip(blocks.starts, ends, strict=True)], axis=1)


def score_word(blocks: Blocks, resamples: int, rng: np.random.Generator,
               ranked: str = DEFAULT_METHOD, most_shuffles: int = 0) -> WordScores:
    """Observed scores, their null distribution's mean and the standardised distance from
    it, and bootstrap intervals; ``resamples`` shuffles and as many bootstrap draws, and
    for ``ranked``'s p up to ``most_shuffles`` shuffles (``change_significance``)."""
    from pipeline.lookup.senses.change_significance import refined_p

    observed = resampled_scores(blocks, np.arange(blocks.n_blocks)[None, :])
    null = resampled_scores(blocks, shuffled_picks(blocks, resamples, rng))
    boot = resampled_scores(blocks, bootstrap_picks(blocks, resamples, rng))
    tail = (1.0 - INTERVAL) / 2 * 100
    out = WordScores({}, {}, {}, {})
    for method in METHODS:
        raw = float(observed[method][0])
        shuffled = null[method][np.isfinite(null[method])]
        drawn = boot[method][np.isfinite(boot[method])]
        out.raw[method] = raw
        if len(shuffled) and np.isfinite(raw):
            sd = float(shuffled.std())
            out.null_mean[method] = float(shuffled.mean())
            out.z[method] = (raw - out.null_mean[method]) / sd if sd > 0 else 0.0
            out.p[method] = float((1 + (shuffled >= raw).sum()) / (1 + len(shuffled)))
        else:
            out.null_mean[method], out.z[method], out.p[method] = np.nan, np.nan, np.nan
        out.interval[method] = (tuple(float(v) for v in np.percentile(
            drawn, [tail, 100 - tail])) if len(drawn) else (np.nan, np.nan))
    out.shuffles = resamples
    if most_shuffles > resamples:
        def draw(n: int) -> np.ndarray:
            return resampled_scores(blocks, shuffled_picks(blocks, n, rng))[ranked]

        out.p[ranked], out.shuffles = refined_p(draw, out.raw[ranked], null[ranked],
                                                most_shuffles)
    return out


# --------------------------------------------------------------------------- senses


def sense_labels(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sense cluster of each sampled unit vector, clustered as ``elmo senses cluster``
    clusters (``clusters.sense_kmeans``, k by its auto rule) up to the k that leaves
    ``USES_PER_SENSE`` uses a cluster on average; all one sense when too few to split."""
    from pipeline.lookup.senses.clusters import sense_kmeans

    max_k = min(MAX_SENSES, len(x) // USES_PER_SENSE)
    if max_k < 2:
        return np.zeros(len(x), np.int64)
    return sense_kmeans(x, "auto", max_k, seed=int(rng.integers(2**31))).labels


def sense_counts(x: np.ndarray, block: np.ndarray, n_blocks: int,
                 rng: np.random.Generator) -> np.ndarray:
    """``[n_blocks, k]``: sampled uses (unit vectors ``x``, in blocks ``block``) per sense."""
    labels = sense_labels(x, rng)
    k = int(labels.max()) + 1 if len(labels) else 1
    out = np.zeros((n_blocks, k))
    np.add.at(out, (block, labels), 1.0)
    return out
