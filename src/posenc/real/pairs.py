"""What results.md reads off the trials every method saw alike: per task and length each method's mean score
with its 95% interval, at each length the paired comparison of every two methods, each method's effective
length, and the suggestion that uses them instead of point estimates.

The payload's ``"trials"`` (written by :mod:`posenc.real.extend`)::

    [{"method", "length", "task", "trial", "depth", "score", "hit"}, ...]

one entry per method, length, task and trial; ``"trial"`` names the same prompt for every method, so two
methods pair on ``(task, trial)``. A method's cell (a length and a task) is complete when it holds every trial
that any method holds there; only complete cells are scored and compared, so every comparison is on the same
trials. Intervals and tests: :mod:`posenc.runs.statistics` (Wilson, exact McNemar, the sign-flip test, the
paired bootstrap; RULER's effective length, Hsieh et al. 2024, arXiv:2404.06654).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations

from posenc.extension import METHODS
from posenc.real.gains import Gains, gain_losers, mean_gain
from posenc.real.layers import parse_method
from posenc.real.questions import QuestionTable
from posenc.runs.statistics import (
    A_BETTER,
    B_BETTER,
    NOLIMA_RATIO,
    RULER_THRESHOLD,
    bootstrap_mean,
    compare_paired,
    effective_length,
    is_hit_miss,
    wilson_interval,
)
from posenc.runs.tables import grid_table

__all__ = [
    "ALPHA",
    "PPL_TOLERANCE",
    "SIMPLICITY",
    "Trials",
    "comparisons_section",
    "effective_section",
    "scores_section",
    "separable_facts",
    "simplicity",
    "suggest",
]

ALPHA = 0.05  # each pair's test; not corrected for the number of pairs
PPL_TOLERANCE = 1.10  # a method's perplexity within 10% of the lowest counts as keeping the model's language
TRIAL_FIELDS = ("method", "length", "task", "trial", "score")
SIMPLICITY = ("the model as trained", "fixed RoPE scalings", "length-dependent scalings", "remaps")
ALL_TASKS = "all tasks"
TASK_AVERAGE = "task average"

Missing = Callable[[str, int], str]  # (method, length) -> what its empty cell says


def simplicity(method: str) -> int:
    """The rank of a ``--methods`` entry in :data:`SIMPLICITY`: 0 none, 1 a fixed RoPE scaling (PI, NTK,
    YaRN, Llama 3.1) or a layer conversion, 2 a length-dependent scaling (dynamic NTK: its schedule changes
    with the length, so must a KV cache), 3 a remap of attention's distances; an entry of several parts
    (``pi+nope-global``) ranks as its most complex part (:func:`posenc.real.layers.parse_method` reads it); an
    entry that is no ``--methods`` entry (a method since unregistered) after them all."""
    try:
        parts = parse_method(method)
    except ValueError:
        return len(SIMPLICITY)
    ranks = [0]
    for part in (p for p in parts if p.method != "none"):
        found = METHODS[part.method]
        ranks.append(3 if found.kind == "remap" else 2 if found.length_dependent else 1)
    return max(ranks)


def _mult(n: int, train_len: int) -> str:
    return f"{n / train_len:g}x"


class Trials(QuestionTable):
    """The payload's trials (:class:`~posenc.real.questions.QuestionTable`): each cell's values are the
    questions' scores."""

    @classmethod
    def read(cls, payload: dict) -> Trials | None:
        """The trials of ``payload``, or None when it has none (results.json written before trials were)."""
        entries = payload.get("trials")
        if not entries:
            return None
        for i, entry in enumerate(entries):
            absent = [f for f in TRIAL_FIELDS if f not in entry]
            if absent:
                raise ValueError(f"payload['trials'][{i}]={entry!r} lacks {', '.join(absent)}")
        return cls.of(payload, entries, lambda e: e["score"])

    def scores(self, method: str, length: int, task: str | None = None) -> list[float] | None:
        """``method``'s scores at ``length`` on ``task``'s trials (every task's with None), in the trials'
        order; None unless it has all of them."""
        return self.values(method, length, task)


def _interval(scores: list[float]) -> tuple[float, float]:
    """95%: Wilson's for hit/miss trials, the percentile bootstrap's for graded scores."""
    if is_hit_miss(scores):
        return wilson_interval(round(math.fsum(scores)), len(scores))
    return bootstrap_mean(scores)


def scores_section(trials: Trials, train_len: int, missing: Missing) -> list[str]:
    """Per task, each method's mean score at each length with its 95% interval."""
    lines = ["", "## Scores per task: mean [95% interval] on the same questions for every method"]
    head = ["method"] + [f"@{n} ({_mult(n, train_len)})" for n in trials.lengths]
    for task in trials.tasks:
        counts = {len([k for k in trials.keys[n] if k[0] == task]) for n in trials.lengths}
        graded = any(
            not is_hit_miss(s)
            for m in trials.methods
            for n in trials.lengths
            if (s := trials.scores(m, n, task)) is not None
        )
        how = (
            "bootstrap percentile interval, 2000 resamples of the questions" if graded else "Wilson interval"
        )
        body = []
        for method in trials.methods:
            cells = []
            for n in trials.lengths:
                s = trials.scores(method, n, task)
                if s is None:
                    cells.append(missing(method, n))
                    continue
                low, high = _interval(s)
                cells.append(f"{math.fsum(s) / len(s):.2f} [{low:.2f}, {high:.2f}]")
            body.append([method, *cells])
        many = "/".join(map(str, sorted(counts)))
        lines += ["", f"### {task}: {many} questions per length, {how}", "", grid_table(head, body, 1)]
    return lines


def _pair_rows(trials: Trials, length: int, task: str | None, alpha: float) -> list[list[str]]:
    rows = []
    for a, b in combinations(trials.methods, 2):
        sa, sb = trials.scores(a, length, task), trials.scores(b, length, task)
        if sa is None or sb is None:
            continue
        c = compare_paired(sa, sb, alpha=alpha)
        p = f"{c.p_value:.3f}" if c.p_value >= 0.001 else "<0.001"
        verdict = {A_BETTER: f"{a} better", B_BETTER: f"{b} better"}.get(c.verdict, c.verdict)
        difference = f"{c.difference:+.2f} [{c.low:+.2f}, {c.high:+.2f}]"
        rows.append([f"{a} vs {b}", str(c.trials), difference, f"{p} ({c.test})", verdict])
    return rows


def comparisons_section(trials: Trials, train_len: int, alpha: float = ALPHA) -> list[str]:
    """At each length, per task (and over all tasks when there are several), every two methods on the same
    trials: the mean difference A - B with its paired bootstrap interval, the exact test's p and the
    verdict at ``alpha``."""
    head = ["A vs B", "questions", f"A - B [{100 * (1 - alpha):g}% interval]", "p (test)", "verdict"]
    tasks = [*trials.tasks, *([None] if len(trials.tasks) > 1 else [])]
    lines = [
        "",
        "## Paired comparisons: every two methods on the same questions",
        "",
        f"The verdict is the exact test's at alpha = {alpha:g}: McNemar's on hit/miss questions, the "
        "sign-flip test on graded scores; the interval is the paired bootstrap's (2000 resamples of the "
        "questions). "
        f"Each pair is one test, not corrected for the number of pairs: of pairs that do not differ, about "
        f"{alpha:g} of them separate by chance. The questions of one haystack share it, so they are not "
        "independent draws: with few haystacks per task, read the p-values as optimistic.",
    ]
    for n in trials.lengths:
        for task in tasks:
            rows = _pair_rows(trials, n, task, alpha)
            if rows:
                name = task or ALL_TASKS
                lines += [
                    "",
                    f"### {n} tokens ({_mult(n, train_len)}), {name}",
                    "",
                    grid_table(head, rows, 2),
                ]
    return lines


def _mean_over_tasks(trials: Trials, method: str, length: int) -> float | None:
    means = [trials.scores(method, length, task) for task in trials.tasks]
    if any(s is None for s in means):
        return None
    return math.fsum(math.fsum(s) / len(s) for s in means) / len(means)


def _effective_cell(scores: dict, lengths: tuple[int, ...], threshold: float, train_len: int) -> str | None:
    """``scores``: {length: mean score or None}; lengths measured in a row from the method's shortest (a
    method other than the model as trained has no ladder below the trained length) decide."""
    measured = {}
    for n in lengths:
        if scores[n] is None:
            if measured:
                break
            continue
        measured[n] = scores[n]
    if not measured:
        return None
    found = effective_length(measured, threshold)
    if found is None:
        first = min(measured)
        return f"below it at {first} ({_mult(first, train_len)})"
    more = " (longer ones not measured)" if found == max(measured) and len(measured) < len(lengths) else ""
    return f"{found} ({_mult(found, train_len)}){more}"


def _by_length(trials: Trials, method: str, task: str) -> dict:
    """{length: ``method``'s mean score on ``task`` (the task average for "task average") or None}."""
    if task == TASK_AVERAGE:
        return {n: _mean_over_tasks(trials, method, n) for n in trials.lengths}
    cells = {n: trials.scores(method, n, task) for n in trials.lengths}
    return {n: None if s is None else math.fsum(s) / len(s) for n, s in cells.items()}


def effective_section(
    trials: Trials, train_len: int, missing: Missing, threshold: float = RULER_THRESHOLD
) -> list[str]:
    """Each method's effective length per task and on the task average (RULER's: every task's mean score
    averaged), with ``threshold`` in percent; then NoLiMa's, against the model's own shortest score."""
    tasks = [*trials.tasks, *([TASK_AVERAGE] if len(trials.tasks) > 1 else [])]
    body = []
    for method in trials.methods:
        row = [method]
        for task in tasks:
            cell = _effective_cell(_by_length(trials, method, task), trials.lengths, threshold, train_len)
            row.append(cell or missing(method, trials.lengths[0]))
        body.append(row)
    return [
        "",
        f"## Effective length: the longest length up to which every length scores at least {threshold:g}%",
        "",
        "RULER's threshold (Hsieh et al. 2024, arXiv:2404.06654): Llama-2-7B's score at 4K. RULER takes the "
        "longest length above it; here every shorter length must pass as well, which is the same whenever "
        "scores fall with length. Read off mean scores: their intervals are in the table above.",
        "",
        grid_table(["method", *tasks], body, 1),
        *_relative_section(trials, train_len, missing, tasks),
    ]


def _relative_section(trials: Trials, train_len: int, missing: Missing, tasks: list[str]) -> list[str]:
    """NoLiMa's effective length: every method against the model as trained at its shortest length."""
    base_method = "none" if "none" in trials.methods else trials.methods[0]
    shortest = trials.lengths[0]
    body = []
    for method in trials.methods:
        row = [method]
        for task in tasks:
            base = _by_length(trials, base_method, task)[shortest]
            scores = _by_length(trials, method, task)
            if base is None or all(v is None for v in scores.values()):
                row.append(missing(method, shortest))
                continue
            threshold = min(100.0, 100 * NOLIMA_RATIO * base)
            cell = _effective_cell(scores, trials.lengths, threshold, train_len) if base > 0 else None
            row.append(cell or f"no baseline ({base_method} scores 0 at {shortest})")
        body.append(row)
    return [
        "",
        f"### Relative to the model's own baseline: every length up to it keeps {100 * NOLIMA_RATIO:g}% of "
        f"{base_method}'s score at {shortest} tokens ({_mult(shortest, train_len)})",
        "",
        "NoLiMa's effective length (Modarressi et al. 2025, arXiv:2502.05167): a model that never reaches "
        "RULER's absolute threshold still has a length to lose.",
        "",
        grid_table(["method", *tasks], body, 1),
    ]


def separable_facts(trials: Trials, train_len: int, alpha: float = ALPHA) -> list[str]:
    """One fact per length past the trained one: how many pairs of methods separate over all the trials."""
    facts = []
    for n in (n for n in trials.lengths if n > train_len):
        rows = _pair_rows(trials, n, None, alpha)
        if rows:
            split = [r[4] for r in rows if r[4].endswith(" better")]
            facts.append(
                f"At {n} tokens ({_mult(n, train_len)}), {len(split)} of {len(rows)} pairs of methods "
                f"separate at alpha {alpha:g} on the same questions' scores; the others are not separable."
            )
    return facts


def suggest(payload: dict, trials: Trials, alpha: float = ALPHA, gains: Gains | None = None) -> str | None:
    """The suggestion from paired statistics, at the longest length past the trained one that some methods
    have every trial of. The tasks decide first: a method that another beats separably there, on the
    questions' scores or on the needle's gain (``gains``, :mod:`posenc.real.gains`), is out. When some pair
    separates, the simplest of the others (:func:`simplicity`), then the highest mean gain, then the highest
    mean score, is suggested. When no pair separates, perplexity decides: of the methods whose perplexity
    there is within :data:`PPL_TOLERANCE` of the lowest (the same tokens for every method), the simplest,
    then the lowest perplexity. The last sentence says which evidence decided."""
    L = payload["train_len"]
    longer = [n for n in trials.lengths if n > L and any(trials.scores(m, n) for m in trials.methods)]
    if not longer:
        return None
    n = longer[-1]
    scored = {m: s for m in trials.methods if (s := trials.scores(m, n)) is not None}
    beaten = {m for a, b in combinations(scored, 2) for m in _loser(scored[a], scored[b], a, b, alpha)}
    on_gain = {m for m in gain_losers(gains, n, alpha) if m in scored} - beaten
    ppl = {r["method"]: r["ppl"].get(str(n)) for r in payload["results"]}
    gain = {m: mean_gain(gains, m, n) if gains is not None else None for m in scored}
    out = beaten | on_gain
    if out:
        kept = [m for m in scored if m not in out]
        broken: set[str] = set()
        pick = min(
            kept,
            key=lambda m: (simplicity(m), -(gain[m] if gain[m] is not None else -math.inf), -sum(scored[m])),
        )
        evidence = (
            "scores" if beaten and not on_gain else "needle gains" if not beaten else "scores and gains"
        )
        decided = (
            f"Decided by the tasks ({evidence}): of the methods no other beats separably there (paired, "
            f"alpha {alpha:g}), the simplest ({' < '.join(SIMPLICITY)}), then the highest needle gain; "
            "perplexity did not weigh in."
        )
    else:
        known = [ppl[m] for m in scored if ppl.get(m) is not None]
        broken = {m for m in scored if ppl.get(m) is not None and ppl[m] > PPL_TOLERANCE * min(known)}
        kept = [m for m in scored if m not in broken] or list(scored)
        pick = min(kept, key=lambda m: (simplicity(m), ppl.get(m) or math.inf, -math.fsum(scored[m])))
        decided = (
            "Decided by perplexity: no two methods separate on the tasks' scores or needle gains there, so "
            f"of the methods whose perplexity is within {100 * (PPL_TOLERANCE - 1):.0f}% of the lowest, the "
            f"simplest ({' < '.join(SIMPLICITY)}), then the lowest perplexity."
        )
    mean = math.fsum(scored[pick]) / len(scored[pick])
    perplexity = f", perplexity {ppl[pick]:.2f}" if ppl.get(pick) is not None else ""
    gained = f", needle gain {gain[pick]:+.2f} nats/token" if gain.get(pick) is not None else ""
    return (
        f"Suggested start at {n} tokens ({_mult(n, L)}): {pick} (mean score {mean:.2f} over "
        f"{len(scored[pick])} questions{gained}{perplexity}); "
        f"{_verdict(pick, scored, kept, beaten, broken, on_gain)}. {decided} A rule of thumb read off these "
        "questions, not a verdict."
    )


def _verdict(pick: str, scored: dict, kept: list, beaten: set, broken: set, on_gain: set) -> str:
    if len(scored) == 1:
        return "the only method with every question measured there"
    parts = [f"not separable from it: {', '.join(m for m in kept if m != pick) or 'no other'}"]
    if beaten:
        parts.append(f"separably worse on the tasks: {', '.join(m for m in scored if m in beaten)}")
    if on_gain:
        parts.append(f"separably lower needle gain: {', '.join(m for m in scored if m in on_gain)}")
    if broken - beaten:
        parts.append(f"perplexity over the tolerance: {', '.join(m for m in scored if m in broken - beaten)}")
    return "; ".join(parts)


def _loser(sa: list[float], sb: list[float], a: str, b: str, alpha: float) -> list[str]:
    verdict = compare_paired(sa, sb, alpha=alpha).verdict
    return [b] if verdict == A_BETTER else [a] if verdict == B_BETTER else []
