"""Fixed-width tables of benchmark rows, and the formats their cells share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """One column: its header, its width (negative: left-aligned) and how a row's cell is written."""

    header: str
    width: int
    cell: Callable[[dict], str]


def table(title: str, columns: Sequence[Column], rows: Sequence[dict], keys: int = 2) -> str:
    """``title``, a header line, then one line per row. A row with "skipped" shows its first ``keys``
    cells (those that name the case) and the reason."""

    def fit(text: str, width: int) -> str:
        return f"{text:<{-width}}" if width < 0 else f"{text:>{width}}"

    lines = [title, " ".join(fit(c.header, c.width) for c in columns).rstrip()]
    for row in rows:
        if "skipped" in row:
            lines.append(
                " ".join(fit(c.cell(row), c.width) for c in columns[:keys]) + f" skipped: {row['skipped']}"
            )
        else:
            lines.append(" ".join(fit(c.cell(row), c.width) for c in columns).rstrip())
    return "\n".join(lines)


def number(value: float | None, spec: str, missing: str = "n/a") -> str:
    """``value`` formatted with ``spec``, or ``missing`` where there is none."""
    return missing if value is None else format(value, spec)


def percent(value: float | None) -> str:
    """A fraction as a whole percentage ("n/a" where there is none)."""
    return "n/a" if value is None else f"{100 * value:.0f}%"


def ratio(numerator: float | None, denominator: float | None, spec: str = ".1f") -> str:
    """numerator / denominator formatted with ``spec``, "n/a" where either is missing."""
    return "n/a" if numerator is None or not denominator else format(numerator / denominator, spec)
