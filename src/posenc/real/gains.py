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
from dataclasses import dataclass
from itertools import combinations

from posenc.runs.statistics import A_BETTER, B_BETTER, cluster_bootstrap_mean, compare_clustered
from posenc.runs.tables import grid_table

__all__ = ["Gains", "gain_comparisons_section", "gain_losers", "gains_section", "mean_gain"]

Missing = Callable[[str, int], str]


def _mult(n: int, train_len: int) -> str:
    return f"{n / train_len:g}x"


@dataclass(frozen=True)
class Gains:
    """The payload's continuous scores: ``cells[(method, length)]`` is ``{(task, question): (gain, logprob
    per token, haystack)}``; ``keys[length]`` every question some method has there; methods, tasks and
    lengths in the payload's order."""

    cells: dict
    keys: dict
    methods: tuple[str, ...]
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]

    @classmethod
    def read(cls, payload: dict) -> Gains | None:
        """The gains of ``payload``, or None when no question has one (results written before them, or
        tasks without needles)."""
        entries = [e for e in payload.get("trials") or () if e.get("gain") is not None]
        if not entries:
            return None
        cells, keys = {}, {}
        for e in entries:
            key = (str(e["task"]), str(e["trial"]))
            per_token = e["logprob"] / e["gold_tokens"]
            cells.setdefault((e["method"], int(e["length"])), {})[key] = (e["gain"], per_token, e["haystack"])
            keys.setdefault(int(e["length"]), {})[key] = None
        named = [r["method"] for r in payload["results"]]
        methods = named + [m for m in dict.fromkeys(e["method"] for e in entries) if m not in named]
        tasks = tuple(dict.fromkeys(str(e["task"]) for e in entries))
        return cls(cells, keys, tuple(methods), tasks, tuple(sorted(keys)))

    def values(self, method: str, length: int, task: str | None = None) -> list[tuple] | None:
        """``method``'s (gain, logprob per token, haystack) on every question at ``length`` (of ``task``; of
        every task with None), in one order for every method; None unless it has all of them."""
        cell = self.cells.get((method, length), {})
        wanted = [k for k in self.keys.get(length, ()) if task is None or k[0] == task]
        if not wanted or any(k not in cell for k in wanted):
            return None
        return [cell[k] for k in wanted]


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
