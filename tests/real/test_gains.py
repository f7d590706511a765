"""The needle gain in results.md (posenc.real.gains): per method and length with cluster intervals, paired
between methods by haystack, and what it does to the suggestion, on payloads made by hand."""

import math

import pytest

from posenc.real import pairs
from posenc.real.gains import Gains, gain_comparisons_section, gain_losers, gains_section, mean_gain
from posenc.runs.statistics import cluster_bootstrap_mean

L = 1000


def _payload(gains: dict, scores: dict | None = None, questions_per_haystack: int = 1) -> dict:
    """gains: (method, length) -> the gain of each question; every question scores 0 unless ``scores``."""
    trials = []
    for (m, n), values in gains.items():
        for i, g in enumerate(values):
            h = i // questions_per_haystack
            trials.append(
                {
                    "method": m,
                    "length": n,
                    "task": "niah_single_1",
                    "trial": f"niah_single_1/{n}/{h}/{i}",
                    "depth": 0.5,
                    "score": (scores or {}).get((m, n), [0] * len(values))[i],
                    "hit": False,
                    "haystack": f"niah_single_1/{n}/{h}",
                    "gain": g,
                    "logprob": -8.0 + g,
                    "control_logprob": -8.0,
                    "gold_tokens": 8,
                }
            )
    methods = list(dict.fromkeys(m for m, _ in gains))
    results = [{"method": m, "ppl": {str(L): 5.0, str(2 * L): 5.0}} for m in methods]
    return {"train_len": L, "lengths": [L, 2 * L], "results": results, "trials": trials}


def test_the_gain_table_gives_the_mean_and_the_haystack_interval():
    values = [0.5, 1.5, 1.0, 2.0, 0.0, 1.0]
    payload = _payload({("none", 2 * L): values}, questions_per_haystack=2)
    gains = Gains.read(payload)
    assert mean_gain(gains, "none", 2 * L) == pytest.approx(1.0)
    low, high = cluster_bootstrap_mean(values, [0, 0, 1, 1, 2, 2])
    text = "\n".join(gains_section(gains, L, lambda m, n: "pending"))
    assert f"| none | +1.00 [{low:+.2f}, {high:+.2f}] (-0.88) |" in text  # (-8 + 1) / 8 per token


def test_a_separably_higher_gain_is_a_verdict_and_a_near_tie_is_not():
    base = [0.1 * i for i in range(12)]
    payload = _payload(
        {
            ("none", 2 * L): base,
            ("yarn", 2 * L): [g + 0.5 + 0.01 * (i % 3) for i, g in enumerate(base)],
            ("ntk", 2 * L): [g + (0.01 if i % 2 else -0.01) for i, g in enumerate(base)],
        }
    )
    gains = Gains.read(payload)
    assert gain_losers(gains, 2 * L, 0.05) == {"none", "ntk"}
    text = "\n".join(gain_comparisons_section(gains, L))
    assert "2 of 3 pairs separate" in text and "| none vs yarn | 12 (12) | -0.510" in text
    assert "yarn better" in text and "| none vs ntk | 12 (12) | +0.000" in text


def test_a_method_with_a_separably_lower_gain_is_never_suggested_on_perplexity():
    """No two methods separate on the hit/miss scores (all 0), yarn's gain is separably above none's: the
    tasks decide, whatever the perplexities say."""
    payload = _payload({("none", 2 * L): [0.2] * 10, ("yarn", 2 * L): [1.2 + 0.01 * i for i in range(10)]})
    payload["results"][0]["ppl"][str(2 * L)] = 4.0  # none has the lower perplexity
    payload["results"][1]["ppl"][str(2 * L)] = 6.0
    pick = pairs.suggest(payload, pairs.Trials.read(payload), gains=Gains.read(payload))
    assert pick.startswith("Suggested start at 2000 tokens (2x): yarn")
    assert "separably lower needle gain: none" in pick and "Decided by the tasks (needle gains)" in pick
    without = pairs.suggest(payload, pairs.Trials.read(payload))
    assert (
        without.startswith("Suggested start at 2000 tokens (2x): none") and "Decided by perplexity" in without
    )


def test_questions_without_a_gain_are_not_read():
    payload = _payload({("none", 2 * L): [1.0, 2.0]})
    for entry in payload["trials"]:
        entry["gain"] = None
    assert Gains.read(payload) is None
    partial = _payload({("none", 2 * L): [1.0, 2.0], ("yarn", 2 * L): [1.0, 2.0]})
    partial["trials"] = partial["trials"][:-1]  # yarn lacks a question: its cell is incomplete
    assert Gains.read(partial).values("yarn", 2 * L) is None
    assert math.isclose(mean_gain(Gains.read(partial), "none", 2 * L), 1.5)
