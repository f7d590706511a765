"""Small statistics for the laboratory's reports: mean and spread over seeds, a binomial interval.

``mean_sd`` summarises one cell measured once per seed (sample standard deviation, n - 1 in the
denominator: the seeds are a sample of the seeds one could have drawn). ``wilson_interval`` is the
score interval of a binomial proportion (Wilson 1927, JASA 22:209), which stays inside [0, 1] and is
not degenerate at 0 or n successes, unlike the normal approximation; it lives in
:mod:`posenc.runs.statistics` with the paired statistics ``posenc extend`` reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from posenc.lab.errors import LabError
from posenc.lab.measures import MEASURE_NAMES
from posenc.runs import statistics
from posenc.runs.statistics import Z95

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


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """:func:`posenc.runs.statistics.wilson_interval`, its bad input raised as the laboratory's
    :class:`LabError` (one line from the CLI)."""
    try:
        return statistics.wilson_interval(successes, trials, z)
    except ValueError as error:
        raise LabError(str(error)) from None


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
