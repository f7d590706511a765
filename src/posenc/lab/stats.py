"""Small statistics for the laboratory's reports: mean and spread over seeds, a binomial interval.

``mean_sd`` summarises one cell measured once per seed (sample standard deviation, n - 1 in the
denominator: the seeds are a sample of the seeds one could have drawn). ``wilson_interval`` is the
score interval of a binomial proportion (Wilson 1927, JASA 22:209), which stays inside [0, 1] and is
not degenerate at 0 or n successes, unlike the normal approximation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from posenc.lab.checks import check_int, check_number
from posenc.lab.errors import LabError
from posenc.lab.measures import MEASURE_NAMES

__all__ = ["combine_seeds", "mean_sd", "pooled_wilson", "wilson_interval"]


def mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """``(mean, sample sd)`` of per-seed values; the mean is None when any value is None (a cell that some
    seed could not measure is not measured), the sd is None with fewer than two values."""
    if not values or any(v is None for v in values):
        return None, None
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def wilson_interval(successes: int, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of a proportion ``successes / trials``; z = 1.96 gives 95%.

    low, high = (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), with p = successes / n.
    """
    check_int("trials", trials)
    check_int("successes", successes, minimum=0)
    if successes > trials:
        raise LabError(f"successes={successes} must be at most trials={trials}")
    check_number("z", z, low=0, low_open=True, finite=True)
    n, p = trials, successes / trials
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    # The bounds at 0 and n successes are exactly 0 and 1; the formula reaches them up to rounding.
    low = 0.0 if successes == 0 else max(0.0, (centre - half) / scale)
    high = 1.0 if successes == trials else min(1.0, (centre + half) / scale)
    return low, high


def pooled_wilson(row: dict, accuracy: float, trials: int) -> tuple[float, float]:
    """The 95% Wilson interval of a report row's passkey ``accuracy``: its mean over the row's ``"seeds"``
    of ``trials`` prompts each, counted as the hits of all the seeds' prompts together."""
    asked = trials * row.get("seeds", 1)
    return wilson_interval(round(accuracy * asked), asked)


def combine_seeds(rows: list[dict]) -> dict:
    """One report row from the rows of the same scheme trained with different seeds.

    Each input row is :meth:`posenc.lab.evaluate.Row.to_dict` plus ``"seed"`` (and timings). Every
    per-length measure (:data:`posenc.lab.measures.MEASURES`, a dict such as ``"ppl"``) becomes its mean
    over the seeds, with ``"<name>_sd"`` beside it; ``"seeds"`` counts them, ``"per_seed"`` keeps each
    seed's values (``{"<seed>": {"<name>": {"<len>": value}}}``), timings are summed, the first note is
    kept.
    """
    if not rows:
        raise LabError("combine_seeds needs at least one row")
    first = rows[0]
    measures = [name for name in MEASURE_NAMES if isinstance(first.get(name), dict)]
    out: dict = {"scheme": first["scheme"], "seeds": len(rows)}
    for name in measures:
        lengths = list(first[name])
        cells = {n: mean_sd([r[name].get(n) for r in rows]) for n in lengths}
        out[name] = {n: m for n, (m, _) in cells.items()}
        out[f"{name}_sd"] = {n: sd for n, (_, sd) in cells.items()}
    out["per_seed"] = {str(r.get("seed")): {name: r[name] for name in measures} for r in rows}
    out["note"] = next((r["note"] for r in rows if r.get("note")), None)
    for t in ("train_s", "eval_s"):
        if all(t in r for r in rows):
            out[t] = round(math.fsum(r[t] for r in rows), 1)
    return out
