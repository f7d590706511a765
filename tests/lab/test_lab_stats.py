"""posenc.lab.stats: the seed summary against numpy, the Wilson interval against its defining quadratic."""

import math

import numpy as np
import pytest

from posenc.lab.errors import LabError
from posenc.lab.stats import combine_seeds, mean_sd, wilson_interval


def test_mean_sd_is_numpys_mean_and_sample_sd():
    values = [3.5, 4.25, 3.0, 5.125]
    mean, sd = mean_sd(values)
    assert mean == pytest.approx(np.mean(values), rel=1e-15)
    assert sd == pytest.approx(np.std(values, ddof=1), rel=1e-12)
    assert mean_sd([2.0]) == (2.0, None)  # one seed: no spread
    assert mean_sd([2.0, None]) == (None, None)  # a seed that could not measure: no mean either
    assert mean_sd([]) == (None, None)


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (10, 10), (1, 1), (17, 40)])
def test_wilson_interval_solves_the_score_equation(k, n):
    """The Wilson bounds are the p with |k/n - p| = z sqrt(p (1 - p) / n): roots of a quadratic."""
    z = 1.959963984540054
    phat = k / n
    # (phat - p)^2 = z^2 p (1 - p) / n  <=>  (1 + z^2/n) p^2 - (2 phat + z^2/n) p + phat^2 = 0
    roots = sorted(np.roots([1 + z * z / n, -(2 * phat + z * z / n), phat * phat]).real)
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(max(0.0, roots[0]), abs=1e-12)
    assert high == pytest.approx(min(1.0, roots[1]), abs=1e-12)
    assert 0.0 <= low <= phat <= high <= 1.0


def test_wilson_interval_refuses_impossible_counts():
    with pytest.raises(LabError, match="successes=5 must be at most trials=4"):
        wilson_interval(5, 4)
    with pytest.raises(LabError, match="trials=0 must be a positive integer"):
        wilson_interval(0, 0)
    with pytest.raises(LabError, match="z=nan must be a finite number > 0"):
        wilson_interval(1, 2, z=math.nan)


def test_combine_seeds_averages_each_measure_and_keeps_the_seeds():
    rows = [
        {
            "scheme": "rope",
            "ppl": {"8": 2.0, "16": None},
            "gain": {},
            "note": None,
            "seed": 3,
            "train_s": 1.0,
        },
        {
            "scheme": "rope",
            "ppl": {"8": 4.0, "16": 5.0},
            "gain": {},
            "note": "n/a",
            "seed": 4,
            "train_s": 2.5,
        },
    ]
    out = combine_seeds(rows)
    assert out["scheme"] == "rope" and out["seeds"] == 2
    assert out["ppl"] == {"8": 3.0, "16": None} and out["gain"] == {} and out["gain_sd"] == {}
    assert out["ppl_sd"]["8"] == pytest.approx(math.sqrt(2.0)) and out["ppl_sd"]["16"] is None
    assert out["per_seed"] == {
        "3": {"ppl": rows[0]["ppl"], "gain": {}},
        "4": {"ppl": rows[1]["ppl"], "gain": {}},
    }
    assert out["note"] == "n/a" and out["train_s"] == 3.5 and "eval_s" not in out
    with pytest.raises(LabError, match="at least one row"):
        combine_seeds([])
