"""The continuous task scores of results.md: the needle's gain and the gold answer's likelihood, per method
and length, with intervals that resample haystacks, and the paired comparison of every two methods on them.

A question's gain (:mod:`posenc.real.trials`) is log p(gold answer | the haystack with its needle) minus
log p(gold answer | the same haystack without it), over the answer's tokens: how much reading the needle
helped, in nats per token. Unlike the hit/miss score it does not floor at 0 when every greedy answer misses,
and it is paired: every method answers the same questions. The payload's ``"trials"`` entries carry
``"gain"``, ``"logprob"``, ``"gold_tokens"`` and ``"haystack"`` (the trial the question was asked in: the unit
that the intervals resample, since questions of one haystack share it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations

from posenc.real.questions import QuestionTable
from posenc.runs.statistics import (
    A_BETTER,
    B_BETTER,
    NOT_SEPARABLE,
    cluster_bootstrap_mean,
    compare_clustered,
)
from posenc.runs.tables import grid_table

__all__ = ["Gains", "gain_comparisons_section", "gain_facts", "gain_losers", "gains_section", "mean_gain"]

Missing = Callable[[str, int], str]


def _mult(n: int, train_len: int) -> str:
    return f"{n / train_len:g}x"


class Gains(QuestionTable):
    """The payload's continuous scores (:class:`~posenc.real.questions.QuestionTable`): each cell's values
    are ``(gain, logprob per token, haystack)``."""

    @classmethod
    def read(cls, payload: dict) -> Gains | None:
        """The gains of ``payload``, or None when no question has one (results written before them, or
        tasks without needles)."""
        entries = [e for e in payload.get("trials") or () if e.get("gain") is not None]
        if not entries:
            return None
        return cls.of(payload, entries, lambda e: (e["gain"], e["logprob"] / e["gold_tokens"], e["haystack"]))


def mean_gain(gains: Gains, method: str, length: int) -> float | None:
    """``method``'s mean gain over every question at ``length``; None unless it has them all."""
    found = gains.values(method, length)
    return None if found is None else math.fsum(v[0] for v in found) / len(found)


def _cell(found: list[tuple]) -> str:
    g = [v[0] for v in found]
    low, high = cluster_bootstrap_mean(g, [v[2] for v in found])
    lp = math.fsum(v[1] for v in found) / len(found)
    return f"{math.fsum(g) / len(g):+.2f} [{low:+.2f}, {high:+.2f}] ({lp:.2f})"


def gains_section(gains: Gains, train_len: int, missing: Missing) -> list[str]:
    """Per task, each method's mean gain at each length with its 95% cluster bootstrap interval, and the
    gold answer's mean log-likelihood per token beside it."""
    lines = [
        "",
        "## Needle gain: nats per answer token, mean [95% interval] (gold answer's log-likelihood per token)",
        "",
        "The gold answer's teacher-forced log-likelihood with the needle minus the same without it (the same "
        "haystack, the needle taken out), per answer token: what reading the needle is worth, a score that "
        "does not floor when every greedy answer misses. Intervals: percentile bootstrap, 2000 resamples of "
        "the haystacks (a haystack's questions are resampled together).",
    ]
    head = ["method"] + [f"@{n} ({_mult(n, train_len)})" for n in gains.lengths]
    for task in gains.tasks:
        body = []
        for method in gains.methods:
            cells = []
            for n in gains.lengths:
                found = gains.values(method, n, task)
                cells.append(missing(method, n) if found is None else _cell(found))
            body.append([method, *cells])
        lines += ["", f"### {task}", "", grid_table(head, body, 1)]
    return lines


def _comparisons(gains: Gains, length: int, alpha: float) -> list[tuple[str, str, object]]:
    """(A, B, comparison) for every two methods with every question at ``length``, over all tasks."""
    out = []
    for a, b in combinations(gains.methods, 2):
        va, vb = gains.values(a, length), gains.values(b, length)
        if va is None or vb is None:
            continue
        clusters = [v[2] for v in va]
        out.append((a, b, compare_clustered([v[0] for v in va], [v[0] for v in vb], clusters, alpha=alpha)))
    return out


def gain_losers(gains: Gains | None, length: int, alpha: float) -> set[str]:
    """The methods whose gain at ``length`` some other method's is separably above (paired, clustered)."""
    if gains is None:
        return set()
    losers = set()
    for a, b, c in _comparisons(gains, length, alpha):
        if c.verdict == A_BETTER:
            losers.add(b)
        elif c.verdict == B_BETTER:
            losers.add(a)
    return losers


def gain_comparisons_section(gains: Gains, train_len: int, alpha: float = 0.05) -> list[str]:
    """At each length from the trained one on, every two methods' gains on the same questions (all tasks):
    the mean difference A - B with its cluster bootstrap interval, the cluster sign-flip test's p, the
    verdict at ``alpha``, and the widest half-width of those intervals."""
    head = ["A vs B", "questions (haystacks)", f"A - B [{100 * (1 - alpha):g}% interval]", "p", "verdict"]
    lines = [
        "",
        "## Paired needle gains: every two methods on the same questions, nats per answer token",
        "",
        f"Verdict at alpha = {alpha:g} by the sign-flip test on each haystack's summed difference; the "
        "interval is the cluster bootstrap's (2000 resamples of the haystacks). One test per pair, not "
        "corrected for the number of pairs.",
    ]
    for n in (n for n in gains.lengths if n >= train_len):
        rows, widest = [], 0.0
        for a, b, c in _comparisons(gains, n, alpha):
            widest = max(widest, (c.high - c.low) / 2)
            p = f"{c.p_value:.3f}" if c.p_value >= 0.001 else "<0.001"
            verdict = {A_BETTER: f"{a} better", B_BETTER: f"{b} better"}.get(c.verdict, c.verdict)
            span = f"{c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}]"
            rows.append([f"{a} vs {b}", f"{c.questions} ({c.clusters})", span, p, verdict])
        if rows:
            split = sum(r[4].endswith(" better") for r in rows)
            lines += [
                "",
                f"### {n} tokens ({_mult(n, train_len)}): {split} of {len(rows)} pairs separate; the widest "
                f"interval is +-{widest:.3f} nats per token",
                "",
                grid_table(head, rows, 2),
            ]
    return lines


def gain_facts(gains: Gains, train_len: int, alpha: float = 0.05) -> list[str]:
    """One fact per length past the trained one: how many pairs separate on the needle gain, and the widest
    interval of a difference."""
    facts = []
    for n in (n for n in gains.lengths if n > train_len):
        found = _comparisons(gains, n, alpha)
        if found:
            split = sum(c.verdict != NOT_SEPARABLE for *_, c in found)
            widest = max((c.high - c.low) / 2 for *_, c in found)
            facts.append(
                f"At {n} tokens ({_mult(n, train_len)}), {split} of {len(found)} pairs of methods separate "
                f"on the needle gain (paired by haystack, alpha {alpha:g}); the widest interval of a "
                f"difference is +-{widest:.3f} nats per answer token."
            )
    return facts
