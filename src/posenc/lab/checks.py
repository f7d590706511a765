"""The laboratory's validators: each returns the checked value or raises a :class:`LabError` naming the
field, the value and what is allowed. They import nothing else of the laboratory, so every module can use
them."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

from posenc.lab.errors import LabError

__all__ = ["check_choice", "check_choices", "check_int", "check_lengths", "check_mix", "check_number"]


def check_int(name: str, value, *, minimum: int = 1) -> int:
    """``value`` when it is an integer >= ``minimum``; booleans are not integers here."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise LabError(f"{name}={value!r} must be {allowed}")
    return value


def check_number(
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    finite: bool = False,
    why: str = "",
) -> float:
    """``value`` when it is a real number (not NaN) in the range: ``low`` (excluded when ``low_open``) up
    to ``high`` inclusive, either optional. ``finite`` also refuses infinities; ``why`` ends the message.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    if ok and finite:
        ok = math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        if high is not None:
            allowed = f" in {'(' if low_open else '['}{low}, {high}]"
        elif low is not None:
            allowed = f" {'>' if low_open else '>='} {low}"
        else:
            allowed = ""
        what = "a finite number" if finite else "a number"
        raise LabError(f"{name}={value!r} must be {what}{allowed}" + (f" ({why})" if why else ""))
    return value


def check_choice(name: str, value, allowed: Iterable[str]) -> str:
    """``value`` when it is one of ``allowed`` (listed in the message in their given order)."""
    allowed = list(allowed)
    if value not in allowed:
        raise LabError(f"{name}={value!r} is not known; allowed: {', '.join(allowed)}")
    return value


def check_choices(name: str, values, allowed: Iterable[str], *, empty_ok: bool = False) -> tuple[str, ...]:
    """A sequence of names, each one of ``allowed``; empty only when ``empty_ok``."""
    allowed = list(allowed)
    unknown = [v for v in values if v not in allowed]
    if not values and not empty_ok:
        raise LabError(f"{name}={list(values)!r} is empty; give one or more of: {', '.join(allowed)}")
    if unknown:
        raise LabError(f"{name}={list(values)!r}: unknown {unknown}; allowed: {', '.join(allowed)}")
    return tuple(values)


def check_lengths(name: str, lengths) -> list[int]:
    """Validate a list of evaluation lengths: positive integers, no duplicates; returned sorted."""
    try:
        values = [int(v) for v in lengths]
    except (TypeError, ValueError):
        raise LabError(f"{name}={lengths!r} must be a list of positive integers") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise LabError(f"{name}={lengths!r} must be a non-empty list of distinct positive integers")
    return sorted(values)


def check_mix(copy_fraction: float, passkey_fraction: float) -> None:
    """The training mix: each share in [0, 1], together at most 1 (a window is one kind or the other)."""
    check_number("copy_fraction", copy_fraction, low=0, high=1)
    check_number("passkey_fraction", passkey_fraction, low=0, high=1)
    if copy_fraction + passkey_fraction > 1:
        raise LabError(
            f"copy_fraction={copy_fraction} and passkey_fraction={passkey_fraction} add up to "
            f"{copy_fraction + passkey_fraction}; the shares of the training mix must add up to at most 1"
        )
