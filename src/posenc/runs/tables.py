"""Tables a run reports, as markdown."""

from __future__ import annotations

__all__ = ["grid_table"]


def grid_table(head: list[str], rows: list[list[str]], text_columns: int) -> str:
    """A markdown table: the first column and the last ``text_columns - 1`` left-aligned, numbers right."""
    numbers = len(head) - text_columns
    align = ["---"] + ["---:"] * numbers + ["---"] * (text_columns - 1)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])
