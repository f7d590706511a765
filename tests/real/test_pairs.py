"""What results.md reads off the trials (posenc.real.pairs): scores with intervals, paired verdicts, effective
lengths and the suggestion, on payloads made by hand so that each number is known."""

import math

import pytest
from scipy.stats import binomtest

from posenc.real import pairs

L = 1000


def _payload(scores: dict, lengths=(L, 2 * L)) -> dict:
    """scores: (method, length) -> list of hit/miss per question of one task."""
    trials = [
        {
            "method": m,
            "length": n,
            "task": "niah",
            "trial": f"niah/{n}/0/{i}",
            "depth": None,
            "score": s,
            "hit": s == 1,
        }
        for (m, n), values in scores.items()
        for i, s in enumerate(values)
    ]
    methods = list(dict.fromkeys(m for m, _ in scores))
    results = [{"method": m, "ppl": {str(n): 5.0 for n in lengths}} for m in methods]
    return {"train_len": L, "lengths": list(lengths), "results": results, "trials": trials}


def test_a_paired_verdict_is_the_exact_test_on_the_same_questions():
    hits = [1] * 18 + [0] * 2
    misses = [1] * 5 + [0] * 15
    payload = _payload({("yarn", 2 * L): hits, ("pi", 2 * L): misses, ("yarn", L): hits, ("pi", L): hits})
    trials = pairs.Trials.read(payload)
    text = "\n".join(pairs.comparisons_section(trials, L))
    assert "| yarn vs pi | 20 | +0.65" in text and "yarn better" in text
    p = binomtest(13, 13, 0.5).pvalue  # 13 discordant questions, all for yarn
    assert f"{p:.3f}" in text or "<0.001" in text
    same = [r for r in text.splitlines() if r.startswith("| yarn vs pi") and "+0.00" in r]
    assert same and "not separable" in same[0]  # at 1x both hit the same 18


def test_the_suggestion_keeps_what_no_method_beats_and_then_the_simplest():
    good = [1] * 18 + [0] * 2
    payload = _payload({("none", 2 * L): [0] * 20, ("selfextend", 2 * L): good, ("yarn", 2 * L): good})
    pick = pairs.suggest(payload, pairs.Trials.read(payload))
    assert pick.startswith("Suggested start at 2000 tokens (2x): yarn")  # not separable, yarn is simpler
    assert "separably worse on the tasks: none" in pick


def test_a_method_whose_perplexity_breaks_is_not_suggested_where_the_tasks_cannot_tell():
    payload = _payload({("none", 2 * L): [0] * 8, ("yarn", 2 * L): [1] + [0] * 7})
    payload["results"][0]["ppl"][str(2 * L)] = 950.0  # the model as trained, past its length
    payload["results"][1]["ppl"][str(2 * L)] = 6.9
    pick = pairs.suggest(payload, pairs.Trials.read(payload))
    assert pick.startswith("Suggested start at 2000 tokens (2x): yarn") and "over the tolerance: none" in pick
    payload["results"][0]["ppl"][str(2 * L)] = 7.2  # within 10%: the simpler one again
    assert pairs.suggest(payload, pairs.Trials.read(payload)).startswith(
        "Suggested start at 2000 tokens (2x): none"
    )


def test_among_methods_the_tasks_cannot_separate_perplexity_decides_before_a_point_estimate():
    """llama3 answers one question more than yarn, not separably; yarn's perplexity is lower: yarn."""
    payload = _payload({("yarn", 2 * L): [1] + [0] * 9, ("llama3", 2 * L): [1, 1] + [0] * 8})
    payload["results"][0]["ppl"][str(2 * L)] = 5.55
    payload["results"][1]["ppl"][str(2 * L)] = 5.90
    pick = pairs.suggest(payload, pairs.Trials.read(payload))
    assert pick.startswith("Suggested start at 2000 tokens (2x): yarn")
    assert "not separable from it: llama3" in pick
    payload["results"][1]["ppl"][str(2 * L)] = 5.55  # a tie of perplexity: the higher score
    assert pairs.suggest(payload, pairs.Trials.read(payload)).startswith(
        "Suggested start at 2000 tokens (2x): llama3"
    )


def test_only_complete_cells_are_scored_and_the_effective_length_reads_the_means():
    payload = _payload({("yarn", L): [1, 1, 1, 1], ("yarn", 2 * L): [1, 1, 1, 0], ("pi", L): [1, 1, 1]})
    trials = pairs.Trials.read(payload)
    assert trials.scores("pi", L) is None  # pi lacks a question that yarn has: not compared on it
    lines = pairs.effective_section(trials, L, lambda m, n: "pending")
    yarn = next(line for line in "\n".join(lines).splitlines() if line.startswith("| yarn"))
    assert "1000 (1x)" in yarn  # 0.75 at 2x is below 85.6%
    assert math.isclose(sum(trials.scores("yarn", 2 * L)) / 4, 0.75)


def test_simplicity_ranks_entries_by_their_most_complex_part():
    assert [pairs.simplicity(m) for m in ("none", "yarn", "dynamic", "selfextend")] == [0, 1, 2, 3]
    assert pairs.simplicity("pi+nope-global@every:4") == 1 and pairs.simplicity("yarn@all") == 1
    assert pairs.simplicity("something-else") == len(pairs.SIMPLICITY)


def test_a_payload_with_a_malformed_trial_is_named():
    with pytest.raises(ValueError, match=r"payload\['trials'\]\[0\].*lacks score"):
        pairs.Trials.read(
            {"trials": [{"method": "a", "length": 1, "task": "t", "trial": "x"}], "results": []}
        )
