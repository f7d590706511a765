"""Statistics of trials that every method sees alike: intervals, paired tests, the verdict between two
methods, and the effective length.

- :func:`wilson_interval`: the score interval of a binomial proportion (Wilson 1927, JASA 22:209), inside
  [0, 1] and not degenerate at 0 or n successes, unlike the normal approximation.
- :func:`mcnemar_p`: McNemar's test of paired hit/miss (McNemar 1947, Psychometrika 12:153) in its exact
  form: under "neither method is better" each discordant trial (one hit, one miss) favours either with
  probability 1/2, so with b and c of them the p-value is min(1, 2 P(X <= min(b, c))), X ~ Bin(b + c, 1/2),
  in exact fractions (the definition of statsmodels' ``mcnemar(exact=True)``).
- :func:`sign_flip_p`: the paired randomisation test (Fisher 1935, *The Design of Experiments* §21) of
  graded scores: under the same null each difference's sign is a fair coin. On hit/miss scores it is
  exact McNemar.
- :func:`bootstrap_mean`, :func:`paired_bootstrap`: percentile intervals (Efron 1979, Ann. Statist. 7:1;
  Efron & Tibshirani 1993, ch. 13) resampling whole trials, so a paired interval is of the mean difference
  on the same trials. Deterministic from ``seed``.
- :func:`compare_paired`: difference, interval, p-value and the verdict "A better", "B better" or "not
  separable".
- :func:`effective_length`: RULER's effective length (Hsieh et al. 2024, arXiv:2404.06654);
  :func:`relative_effective_length`: NoLiMa's (Modarressi et al. 2025, arXiv:2502.05167), against the
  model's own score at its shortest length.
- :func:`cluster_bootstrap_mean`, :func:`compare_clustered`: for continuous scores (any real number) of
  questions that share a haystack: the percentile interval resamples whole haystacks (clusters) with
  replacement (Davison & Hinkley 1997, *Bootstrap Methods*, §3.8), and the paired test flips the sign of
  each haystack's summed difference.

Scores are per trial, in [0, 1] (1 a hit); every input is checked before any work, and a ValueError names
the argument, the value and what is allowed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "A_BETTER",
    "B_BETTER",
    "NOLIMA_RATIO",
    "NOT_SEPARABLE",
    "RULER_THRESHOLD",
    "Z95",
    "PairedComparison",
    "ClusteredComparison",
    "bootstrap_mean",
    "cluster_bootstrap_mean",
    "compare_clustered",
    "compare_paired",
    "effective_length",
    "is_hit_miss",
    "mcnemar_p",
    "paired_bootstrap",
    "relative_effective_length",
    "sign_flip_p",
    "wilson_interval",
]

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: z of a two-sided 95% interval
RULER_THRESHOLD = 85.6  # percent: RULER's, Llama-2-7B's average score at 4K (Hsieh et al. 2024, Table 3)
A_BETTER, B_BETTER, NOT_SEPARABLE = "A better", "B better", "not separable"
EXACT_SIGN_FLIPS = 16  # up to this many non-zero differences the sign-flip test enumerates all 2^n signs


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)


def _count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name}={value!r} must be {allowed}")
    return int(value)


def _open_unit(name: str, value) -> float:
    if not _is_number(value) or not 0 < value < 1:
        raise ValueError(f"{name}={value!r} must be a number in (0, 1)")
    return float(value)


def _scores(name: str, values) -> np.ndarray:
    """``values`` as float64: a non-empty sequence of numbers in [0, 1] (booleans count as 0 and 1)."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name}={values!r} must be a sequence of scores in [0, 1], one per trial")
    if len(values) == 0:
        raise ValueError(f"{name}={list(values)!r} is empty: give one score in [0, 1] per trial")
    for i, v in enumerate(values):
        if not isinstance(v, (numbers.Real, np.bool_)) or math.isnan(v) or not 0 <= v <= 1:
            raise ValueError(f"{name}[{i}]={v!r} must be a score in [0, 1]")
    return np.asarray(values, dtype=np.float64)


def _paired(scores_a, scores_b) -> tuple[np.ndarray, np.ndarray]:
    a, b = _scores("scores_a", scores_a), _scores("scores_b", scores_b)
    if len(a) != len(b):
        raise ValueError(
            f"scores_a has {len(a)} trials and scores_b {len(b)}: paired statistics need both methods' "
            "score on every trial"
        )
    return a, b


def _resampling(n_resamples, seed) -> tuple[int, int]:
    return _count("n_resamples", n_resamples), _count("seed", seed, minimum=0)


def is_hit_miss(scores) -> bool:
    """Whether every score is 0 or 1 (hit/miss trials, for McNemar and Wilson)."""
    values = _scores("scores", scores)
    return bool(np.all((values == 0) | (values == 1)))


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of a proportion ``successes / trials``; z = 1.96 gives 95%.

    low, high = (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), with p = successes / n.
    """
    trials, successes = _count("trials", trials), _count("successes", successes, minimum=0)
    if successes > trials:
        raise ValueError(f"successes={successes} must be at most trials={trials}")
    if not _is_number(z) or not math.isfinite(z) or z <= 0:
        raise ValueError(f"z={z!r} must be a finite number > 0")
    n, p = trials, successes / trials
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    # The bounds at 0 and n successes are exactly 0 and 1; the formula reaches them up to rounding.
    low = 0.0 if successes == 0 else max(0.0, (centre - half) / scale)
    high = 1.0 if successes == trials else min(1.0, (centre + half) / scale)
    return low, high


def mcnemar_p(only_a: int, only_b: int) -> float:
    """The two-sided exact McNemar p-value of ``only_a`` trials that A hit and B missed against ``only_b``
    the other way round: min(1, 2 sum_{k <= m} C(n, k) / 2^n), n = only_a + only_b, m = min of the two;
    1 when no trial is discordant."""
    only_a, only_b = _count("only_a", only_a, minimum=0), _count("only_b", only_b, minimum=0)
    n, m = only_a + only_b, min(only_a, only_b)
    tail = Fraction(sum(math.comb(n, k) for k in range(m + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


def sign_flip_p(differences, *, n_resamples: int = 2000, seed: int = 0) -> float:
    """The two-sided p-value of the paired sign-flip test: the share of sign assignments of the non-zero
    ``differences`` (each in [-1, 1]) whose sum is at least as far from 0 as the observed one. Exact over
    all 2^n assignments up to :data:`EXACT_SIGN_FLIPS` of them; beyond, ``n_resamples`` random ones,
    (1 + as far) / (1 + n_resamples) (Phipson & Smyth 2010, SAGMB 9:39), never 0."""
    n_resamples, seed = _resampling(n_resamples, seed)
    try:
        d = np.asarray(differences, dtype=np.float64)
    except (TypeError, ValueError):
        d = np.array([np.nan])
    if d.ndim != 1 or np.isnan(d).any() or np.abs(d).max(initial=0) > 1:
        raise ValueError(f"differences={differences!r} must be a sequence of numbers in [-1, 1]")
    return _sign_flip(d, n_resamples, seed)


def _sign_flip(d: np.ndarray, n_resamples: int, seed: int) -> float:
    """The two-sided sign-flip p-value of the differences ``d`` (finite, any scale)."""
    d = d[d != 0]
    if len(d) == 0:
        return 1.0
    # sums that differ from the observed one by rounding alone count as equally far
    observed = abs(d.sum()) - 1e-9 * np.abs(d).sum()
    if len(d) <= EXACT_SIGN_FLIPS:
        # row i of signs: the bits of i as +1 / -1, every assignment once
        signs = 1.0 - 2.0 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)
        return float(np.mean(np.abs(signs @ d) >= observed))
    rng, block = np.random.default_rng(seed), max(1, 2**20 // len(d))  # at most about 8 MiB of signs
    far = 0
    for start in range(0, n_resamples, block):
        signs = rng.choice((1.0, -1.0), size=(min(block, n_resamples - start), len(d)))
        far += int(np.count_nonzero(np.abs(signs @ d) >= observed))
    return (1 + far) / (1 + n_resamples)


def _percentile_interval(
    values: np.ndarray, level: float, n_resamples: int, seed: int
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values``, resampled with replacement."""
    rng, n = np.random.default_rng(seed), len(values)
    block = max(1, 2**20 // n)  # resamples drawn at once: at most about 8 MiB of indices
    means = np.concatenate(
        [
            values[rng.integers(0, n, size=(min(block, n_resamples - start), n))].mean(axis=1)
            for start in range(0, n_resamples, block)
        ]
    )
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def bootstrap_mean(
    scores, *, level: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """The percentile bootstrap interval ``(low, high)`` at ``level`` of the mean of per-trial ``scores``
    in [0, 1]. With few trials it is too narrow (it knows only the scores seen); hit/miss trials are
    better served by :func:`wilson_interval`."""
    values = _scores("scores", scores)
    level = _open_unit("level", level)
    return _percentile_interval(values, level, *_resampling(n_resamples, seed))


def paired_bootstrap(
    scores_a, scores_b, *, level: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """The percentile bootstrap interval ``(low, high)`` at ``level`` of mean(a_i - b_i): trials resampled
    with replacement, each carrying both methods' scores on it. ``scores_a[i]`` and ``scores_b[i]`` are the
    two methods' scores on trial i, in [0, 1]."""
    a, b = _paired(scores_a, scores_b)
    level = _open_unit("level", level)
    return _percentile_interval(a - b, level, *_resampling(n_resamples, seed))


@dataclass(frozen=True)
class PairedComparison:
    """Method A against method B on the same ``trials``.

    difference: mean(a_i - b_i), in [-1, 1]. low, high: its paired bootstrap interval at 1 - alpha.
    p_value: exact McNemar on hit/miss trials (``test`` "McNemar"), else the paired sign-flip test
    ("sign-flip"). verdict: :data:`A_BETTER` or :data:`B_BETTER` when p_value < alpha (the side with the
    larger mean), else :data:`NOT_SEPARABLE`.
    """

    trials: int
    difference: float
    low: float
    high: float
    p_value: float
    test: str
    verdict: str


def compare_paired(
    scores_a, scores_b, *, alpha: float = 0.05, n_resamples: int = 2000, seed: int = 0
) -> PairedComparison:
    """Whether A or B scores better on the same trials, at level ``alpha``: the exact test decides (the
    percentile bootstrap alone would call two trials that agree in sign separable); the bootstrap interval
    says by how much. Each call is one test at ``alpha``: comparing many pairs, some will separate by
    chance (about alpha of those that do not differ)."""
    a, b = _paired(scores_a, scores_b)
    alpha = _open_unit("alpha", alpha)
    n_resamples, seed = _resampling(n_resamples, seed)
    if is_hit_miss(a) and is_hit_miss(b):
        test = "McNemar"
        p = mcnemar_p(int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1))))
    else:
        test = "sign-flip"
        p = sign_flip_p(a - b, n_resamples=n_resamples, seed=seed)
    difference = float(np.mean(a - b))
    low, high = _percentile_interval(a - b, 1 - alpha, n_resamples, seed)
    verdict = NOT_SEPARABLE
    if p < alpha and difference != 0:
        verdict = A_BETTER if difference > 0 else B_BETTER
    return PairedComparison(len(a), difference, low, high, p, test, verdict)


def effective_length(scores_by_length: Mapping[int, float], threshold: float = RULER_THRESHOLD) -> int | None:
    """RULER's effective length (Hsieh et al. 2024, arXiv:2404.06654, §4): the longest length whose score,
    in percent, is at least ``threshold`` (RULER's 85.6 by default); None when even the shortest misses it.

    ``scores_by_length``: {length: score in [0, 1]}. RULER takes the longest length that passes; here every
    shorter length must pass too, so a method that fails at 2x and recovers at 4x is effective to 1x only
    (the two agree whenever scores fall with length, as in every model RULER reports). A score that meets
    the threshold up to rounding (7/10 against 70) meets it.
    """
    if not isinstance(scores_by_length, Mapping) or not scores_by_length:
        raise ValueError(f"scores_by_length={scores_by_length!r} must be a non-empty {{length: score}} dict")
    if not _is_number(threshold) or not 0 <= threshold <= 100:
        raise ValueError(f"threshold={threshold!r} must be a number in [0, 100] (a score in percent)")
    for length, score in scores_by_length.items():
        _count("length", length)
        if not _is_number(score) or not 0 <= score <= 1:
            raise ValueError(f"scores_by_length[{length}]={score!r} must be a score in [0, 1]")
    effective = None
    for length in sorted(scores_by_length):
        percent = 100 * scores_by_length[length]
        if percent < threshold and not math.isclose(percent, threshold, rel_tol=1e-12, abs_tol=1e-9):
            break
        effective = int(length)
    return effective


NOLIMA_RATIO = 0.85  # NoLiMa's: a length is effective while it keeps 85% of the model's own short score


def relative_effective_length(
    scores_by_length: Mapping[int, float], base: float, ratio: float = NOLIMA_RATIO
) -> int | None:
    """NoLiMa's effective length (Modarressi et al. 2025, arXiv:2502.05167, §4): the longest length up to
    which every length scores at least ``ratio`` times ``base``, the model's own score at its shortest
    length; None when the shortest here misses it (or ``base`` is 0: nothing to keep)."""
    if not _is_number(base) or not 0 <= base <= 1:
        raise ValueError(f"base={base!r} must be a score in [0, 1]")
    if not _is_number(ratio) or not 0 < ratio <= 1:
        raise ValueError(f"ratio={ratio!r} must be a number in (0, 1]")
    if base == 0:
        return None
    return effective_length(scores_by_length, threshold=min(100.0, 100 * ratio * base))


def _clusters(name: str, values, clusters) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as floats and ``clusters`` as the index of each one's cluster (0..k-1, in first order)."""
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        v = np.array([np.nan])
    if v.ndim != 1 or len(v) == 0 or not np.isfinite(v).all():
        raise ValueError(f"{name}={values!r} must be a non-empty sequence of finite numbers")
    labels = list(clusters)
    if len(labels) != len(v):
        raise ValueError(f"clusters has {len(labels)} labels for {len(v)} values; give one per value")
    index = {c: i for i, c in enumerate(dict.fromkeys(labels))}
    return v, np.array([index[c] for c in labels])


def _cluster_means(v: np.ndarray, c: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """The mean of every value of ``n_resamples`` resamples of whole clusters, with replacement."""
    k = int(c.max()) + 1
    sums, counts = np.bincount(c, weights=v, minlength=k), np.bincount(c, minlength=k).astype(np.float64)
    rng, block = np.random.default_rng(seed), max(1, 2**20 // k)
    out = []
    for start in range(0, n_resamples, block):
        # how often each cluster is drawn in each resample
        drawn = rng.integers(0, k, size=(min(block, n_resamples - start), k))
        times = np.apply_along_axis(np.bincount, 1, drawn, minlength=k).astype(np.float64)
        out.append((times @ sums) / (times @ counts))
    return np.concatenate(out)


def cluster_bootstrap_mean(
    values, clusters, *, level: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """The percentile interval ``(low, high)`` at ``level`` of the mean of ``values`` (any finite numbers),
    resampling whole clusters: ``clusters[i]`` names value i's (questions asked of one haystack share it,
    so they are not independent draws). With one value a cluster it is :func:`bootstrap_mean`'s."""
    v, c = _clusters("values", values, clusters)
    level = _open_unit("level", level)
    means = _cluster_means(v, c, *_resampling(n_resamples, seed))
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class ClusteredComparison:
    """A against B on the same questions, with continuous scores: ``questions``, ``clusters`` (haystacks),
    ``difference`` mean(a - b), its cluster bootstrap interval ``low``, ``high`` at 1 - alpha, the cluster
    sign-flip test's ``p_value``, and the verdict (:data:`A_BETTER`, :data:`B_BETTER` or
    :data:`NOT_SEPARABLE`)."""

    questions: int
    clusters: int
    difference: float
    low: float
    high: float
    p_value: float
    verdict: str


def compare_clustered(
    scores_a, scores_b, clusters, *, alpha: float = 0.05, n_resamples: int = 2000, seed: int = 0
) -> ClusteredComparison:
    """Whether A or B scores higher on the same questions (continuous scores, such as the needle's gain in
    nats per token), the questions grouped in ``clusters``: the sign-flip test on each cluster's summed
    difference decides (under "neither is better" a whole haystack's difference is as likely either sign),
    the cluster bootstrap says by how much."""
    a, c = _clusters("scores_a", scores_a, clusters)
    b, _ = _clusters("scores_b", scores_b, clusters)
    if len(a) != len(b):
        raise ValueError(f"scores_a and scores_b must pair: {len(a)} and {len(b)} values")
    alpha = _open_unit("alpha", alpha)
    n_resamples, seed = _resampling(n_resamples, seed)
    d = a - b
    p = _sign_flip(np.bincount(c, weights=d), n_resamples, seed)
    means = _cluster_means(d, c, n_resamples, seed)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    difference = float(d.mean())
    verdict = NOT_SEPARABLE
    if p < alpha and difference != 0:
        verdict = A_BETTER if difference > 0 else B_BETTER
    return ClusteredComparison(len(d), int(c.max()) + 1, difference, float(low), float(high), p, verdict)
