"""posenc.runs.statistics: exact McNemar and the sign-flip test against enumerating every outcome, the paired
bootstrap by its properties and its exact small case, the verdict, RULER's effective length, the refusals."""

import math
import re
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc.lab.errors import LabError
from posenc.lab.stats import wilson_interval as lab_wilson
from posenc.runs import statistics
from posenc.runs.statistics import (
    A_BETTER,
    B_BETTER,
    NOT_SEPARABLE,
    bootstrap_mean,
    compare_paired,
    effective_length,
    is_hit_miss,
    mcnemar_p,
    paired_bootstrap,
    sign_flip_p,
    wilson_interval,
)

unit = st.floats(0, 1, allow_nan=False)


@st.composite
def paired_scores(draw, max_size=30):
    n = draw(st.integers(1, max_size))
    return draw(st.lists(unit, min_size=n, max_size=n)), draw(st.lists(unit, min_size=n, max_size=n))


def enumerated_mcnemar(only_a: int, only_b: int) -> float:
    """Every way the discordant trials could have split, each equally likely under the null: the share that
    splits at least as unevenly as the one observed."""
    n, observed = only_a + only_b, min(only_a, only_b)
    outcomes = list(product((0, 1), repeat=n))
    uneven = sum(1 for o in outcomes if min(sum(o), n - sum(o)) <= observed)
    return float(Fraction(uneven, len(outcomes)))


@pytest.mark.parametrize("only_a, only_b", [(a, b) for a in range(8) for b in range(8)])
def test_exact_mcnemar_is_the_share_of_splits_as_uneven(only_a, only_b):
    assert mcnemar_p(only_a, only_b) == enumerated_mcnemar(only_a, only_b)


def test_exact_mcnemar_agrees_with_scipys_binomial_test():
    """McNemar's exact test is the two-sided binomial test of the discordant pairs at 1/2 (scipy's own)."""
    from scipy.stats import binomtest

    for only_a, only_b in [(6, 0), (2, 9), (5, 5), (0, 1), (13, 4), (40, 25)]:
        want = binomtest(only_a, only_a + only_b, 0.5).pvalue
        assert mcnemar_p(only_a, only_b) == pytest.approx(want, rel=1e-12)
    assert mcnemar_p(0, 0) == 1.0  # no discordant pair: nothing to test


def test_sign_flips_of_hits_and_misses_are_exact_mcnemar():
    """On hit/miss trials a difference is -1, 0 or 1, and flipping signs is re-splitting the discordant."""
    rng = np.random.default_rng(3)
    for n in (1, 5, 12, 16, 40):  # 40 discordant at most: past 16 the flips are sampled
        a, b = rng.integers(0, 2, n), rng.integers(0, 2, n)
        exact = mcnemar_p(int(np.sum(a > b)), int(np.sum(a < b)))
        p = sign_flip_p(a - b, n_resamples=20_000)
        assert p == exact if np.count_nonzero(a - b) <= 16 else p == pytest.approx(exact, abs=0.02)


@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=8))
def test_sign_flip_p_is_the_share_of_signs_at_least_as_far(d):
    nonzero = [x for x in d if x != 0]
    sums = [
        abs(math.fsum(s * x for s, x in zip(signs, nonzero, strict=True)))
        for signs in product((1, -1), repeat=len(nonzero))
    ]
    observed = abs(math.fsum(nonzero))
    want = sum(1 for s in sums if s >= observed - 1e-9) / len(sums)
    assert sign_flip_p(d) == pytest.approx(want, abs=1e-12)


def test_wilson_interval_moved_keeping_the_laboratorys_error():
    assert wilson_interval(6, 8) == lab_wilson(6, 8)
    with pytest.raises(ValueError, match="successes=5 must be at most trials=4") as raised:
        wilson_interval(5, 4)
    assert not isinstance(raised.value, LabError)  # the library knows nothing of the laboratory
    with pytest.raises(LabError, match="successes=5 must be at most trials=4"):
        lab_wilson(5, 4)


@given(paired_scores())
def test_the_paired_interval_holds_the_observed_difference_and_lies_in_its_range(pair):
    a, b = pair
    d = np.subtract(a, b)
    low, high = paired_bootstrap(a, b, n_resamples=400)
    assert d.min() - 1e-12 <= low <= d.mean() + 1e-12 and d.mean() - 1e-12 <= high <= d.max() + 1e-12


@given(paired_scores())
def test_the_paired_interval_is_zero_for_a_method_against_itself_and_turns_over_when_swapped(pair):
    a, b = pair
    assert paired_bootstrap(a, a) == (0.0, 0.0)
    low, high = paired_bootstrap(a, b, n_resamples=400, seed=5)
    swapped = paired_bootstrap(b, a, n_resamples=400, seed=5)
    assert swapped == pytest.approx((-high, -low), abs=1e-12)
    assert paired_bootstrap(a, b, n_resamples=400, seed=5) == (low, high)  # deterministic from the seed


@given(paired_scores(), st.floats(0, 1))
def test_the_paired_interval_ignores_a_shift_of_both_methods(pair, fraction):
    a, b = (np.asarray(x) / 2 for x in pair)  # in [0, 0.5]: room for the shift
    shift = fraction / 2
    moved = paired_bootstrap(a + shift, b + shift, n_resamples=300)
    assert moved == pytest.approx(paired_bootstrap(a, b, n_resamples=300), abs=1e-9)


def test_the_bootstrap_of_two_trials_spans_them():
    """Resampling two trials gives x, (x + y) / 2 or y with chances 1/4, 1/2, 1/4: the 95% bounds are x, y."""
    assert paired_bootstrap([0.9, 0.4], [0.1, 0.3]) == pytest.approx((0.1, 0.8))
    assert bootstrap_mean([0.25, 0.75]) == pytest.approx((0.25, 0.75))
    assert bootstrap_mean([0.6] * 7) == pytest.approx((0.6, 0.6))


def test_hit_miss_trials_are_decided_by_exact_mcnemar():
    a = [1, 1, 1, 1, 1, 1, 0, 1]
    b = [0, 0, 0, 0, 0, 0, 0, 1]  # six discordant, all A's: p = 2 / 2^6
    out = compare_paired(a, b)
    assert (out.trials, out.test, out.verdict) == (8, "McNemar", A_BETTER)
    assert out.p_value == 2 / 64 and out.difference == 0.75
    assert compare_paired(b, a).verdict == B_BETTER
    five = compare_paired(a[1:], b[1:])  # five of them: p = 2 / 32 > 0.05
    assert five.verdict == NOT_SEPARABLE and five.p_value == 1 / 16
    assert compare_paired(a[1:], b[1:], alpha=0.1).verdict == A_BETTER
    assert compare_paired([True, False], [1.0, 0.0]).verdict == NOT_SEPARABLE


def test_graded_scores_are_decided_by_the_sign_flip_test_not_by_a_tight_bootstrap():
    """Two trials that agree in sign give a bootstrap interval off 0; 4 sign patterns cannot reach 5%."""
    out = compare_paired([0.9, 0.8], [0.1, 0.2])
    assert out.low > 0 and out.test == "sign-flip" and out.p_value == 0.5 and out.verdict == NOT_SEPARABLE
    a = [0.5, 0.7, 0.9, 1.0, 0.8, 0.6]
    b = [0.2, 0.3, 0.5, 0.6, 0.1, 0.2]  # six differences of one sign: p = 2 / 2^6
    out = compare_paired(a, b)
    assert out.p_value == pytest.approx(2 / 64) and out.verdict == A_BETTER
    assert out.difference == pytest.approx(np.mean(np.subtract(a, b)))


def test_is_hit_miss():
    assert is_hit_miss([0, 1, 1.0, True]) and not is_hit_miss([0, 0.5])


def passing_prefix(scores: dict, threshold: float):
    """The longest length up to which every length scores at least the threshold, by brute force."""
    lengths = sorted(scores)
    passing = [n for n in lengths if all(100 * scores[m] >= threshold - 1e-9 for m in lengths if m <= n)]
    return max(passing, default=None)


def test_effective_length_is_the_longest_of_an_unbroken_run_of_passing_lengths():
    assert effective_length({4096: 0.95, 8192: 0.90, 16384: 0.70}) == 8192
    assert effective_length({16384: 0.70, 4096: 0.95, 8192: 0.90}) == 8192  # any order
    assert effective_length({4096: 0.95, 8192: 0.80, 16384: 0.90}) == 4096  # no recovery past a failure
    assert effective_length({4096: 0.80}) is None
    assert effective_length({4096: 0.856}) == 4096  # RULER's threshold, met exactly
    assert effective_length({4096: 0.7, 8192: 0.69}, threshold=70) == 4096  # 7/10 meets 70 despite rounding
    assert effective_length({4096: 0.0}, threshold=0) == 4096


@given(st.dictionaries(st.integers(1, 10**6), unit, min_size=1, max_size=6), st.floats(0, 100))
def test_effective_length_is_the_brute_force_prefix(scores, threshold):
    assert effective_length(scores, threshold) == passing_prefix(scores, threshold)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: paired_bootstrap([0.1, 0.2], [0.3]), "scores_a has 2 trials and scores_b 1"),
        (lambda: compare_paired([0.1], [1.5]), r"scores_b\[0\]=1.5 must be a score in \[0, 1\]"),
        (lambda: compare_paired([math.nan], [0.5]), r"scores_a\[0\]=nan must be a score in \[0, 1\]"),
        (lambda: compare_paired([], []), r"scores_a=\[\] is empty"),
        (lambda: compare_paired("ab", "cd"), "scores_a='ab' must be a sequence of scores"),
        (lambda: compare_paired([1], [0], alpha=0), r"alpha=0 must be a number in \(0, 1\)"),
        (lambda: compare_paired([1], [0], alpha=1.0), r"alpha=1.0 must be a number in \(0, 1\)"),
        (lambda: bootstrap_mean([0.5], level=math.nan), r"level=nan must be a number in \(0, 1\)"),
        (lambda: bootstrap_mean([0.5], n_resamples=0), "n_resamples=0 must be a positive integer"),
        (lambda: bootstrap_mean([0.5], seed=-1), "seed=-1 must be an integer >= 0"),
        (lambda: sign_flip_p([2.0]), r"must be a sequence of numbers in \[-1, 1\]"),
        (lambda: sign_flip_p(["x"]), r"must be a sequence of numbers in \[-1, 1\]"),
        (lambda: mcnemar_p(-1, 2), "only_a=-1 must be an integer >= 0"),
        (lambda: effective_length({}), "must be a non-empty"),
        (lambda: effective_length({0: 0.5}), "length=0 must be a positive integer"),
        (lambda: effective_length({100: 1.2}), r"scores_by_length\[100\]=1.2 must be a score in \[0, 1\]"),
        (
            lambda: effective_length({100: 0.9}, threshold=101),
            r"threshold=101 must be a number in \[0, 100\]",
        ),
        (lambda: wilson_interval(0, 0), "trials=0 must be a positive integer"),
        (lambda: wilson_interval(1, 2, z=math.inf), "z=inf must be a finite number > 0"),
    ],
)
def test_bad_input_is_one_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_module_names_its_sources():
    doc = statistics.__doc__
    assert "McNemar 1947" in doc and "Efron 1979" in doc and "arXiv:2404.06654" in doc


def _enumerated_cluster_means(values, clusters):
    """Every resample of whole clusters with replacement (k^k ordered draws, equally likely) and its mean."""
    labels = list(dict.fromkeys(clusters))
    k = len(labels)
    sums = [math.fsum(v for v, c in zip(values, clusters, strict=True) if c == lab) for lab in labels]
    counts = [sum(c == lab for c in clusters) for lab in labels]
    means = []
    for draw in product(range(k), repeat=k):
        means.append(math.fsum(sums[i] for i in draw) / sum(counts[i] for i in draw))
    return np.array(means)


def test_the_cluster_bootstrap_resamples_whole_clusters_as_enumeration_does():
    values = [0.3, -1.2, 2.5, 0.1, 0.4, -0.7]
    clusters = ["a", "a", "b", "c", "c", "c"]
    exact = _enumerated_cluster_means(values, clusters)  # each of the 27 draws 1/27 likely
    for level in (0.5, 0.8, 0.95):
        low, high = statistics.cluster_bootstrap_mean(
            values, clusters, level=level, n_resamples=40_000, seed=3
        )
        tail = (1 - level) / 2
        e_low, e_high = np.quantile(exact, [tail, 1 - tail], method="inverted_cdf")
        assert low == pytest.approx(e_low, abs=1e-9) and high == pytest.approx(e_high, abs=1e-9)


def test_one_value_a_cluster_is_the_plain_bootstrap():
    values = [0.0, 1.0, 1.0, 0.0, 1.0]
    plain = statistics.bootstrap_mean(values, n_resamples=20_000, seed=1)
    clustered = statistics.cluster_bootstrap_mean(values, range(5), n_resamples=20_000, seed=1)
    assert clustered == pytest.approx(plain, abs=0.03)


def test_the_clustered_test_flips_each_haystacks_summed_difference():
    a = [1.0, 2.0, 0.5, 3.0, 1.5, 2.5]
    b = [0.0, 0.5, 0.0, 1.0, 0.0, 1.0]
    clusters = [0, 0, 1, 1, 2, 2]
    c = statistics.compare_clustered(a, b, clusters)
    # three haystacks, every summed difference positive: 2 of the 8 sign assignments are as far
    assert c.p_value == pytest.approx(2 / 8) and c.verdict == statistics.NOT_SEPARABLE
    assert c.clusters == 3 and c.questions == 6 and c.difference == pytest.approx(np.mean(np.subtract(a, b)))
    many = statistics.compare_clustered(a * 3, b * 3, [i // 2 for i in range(18)])
    assert many.p_value == pytest.approx(2 / 2**9) and many.verdict == statistics.A_BETTER
    assert (
        many.low > 0 and statistics.compare_clustered(b * 3, a * 3, range(18)).verdict == statistics.B_BETTER
    )


def test_nolimas_effective_length_is_relative_to_the_models_own_short_score():
    scores = {1024: 0.8, 2048: 0.7, 4096: 0.6, 8192: 0.2}
    assert statistics.relative_effective_length(scores, base=0.8) == 2048  # 0.85 * 0.8 = 0.68
    assert statistics.relative_effective_length(scores, base=0.7) == 4096  # 0.595
    assert statistics.effective_length(scores) is None  # RULER's absolute 85.6 is never met
    assert statistics.relative_effective_length(scores, base=0.0) is None


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: statistics.cluster_bootstrap_mean([1.0, math.nan], [0, 1]), "finite numbers"),
        (lambda: statistics.cluster_bootstrap_mean([1.0, 2.0], [0]), "1 labels for 2 values"),
        (lambda: statistics.compare_clustered([1.0], [1.0, 2.0], [0]), "clusters has 1 labels for 2"),
        (lambda: statistics.relative_effective_length({1: 0.5}, base=2), "base=2 must be a score"),
    ],
)
def test_bad_clustered_input_is_refused_by_name(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
