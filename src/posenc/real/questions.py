"""The payload's questions as a table that pairs methods: one value per method, length and question.

Every method answers the same questions at a length, so two methods pair on ``(task, trial)``. A method's
cell (a length, and a task or all of them) counts only when it holds every question that any method holds
there, so that every comparison is on the same questions. :class:`~posenc.real.pairs.Trials` reads the
scores so, :class:`~posenc.real.gains.Gains` the needle's gains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["QuestionTable"]


@dataclass(frozen=True)
class QuestionTable:
    """``cells[(method, length)]`` is ``{(task, trial): value}``; ``keys[length]`` every ``(task, trial)``
    that some method has there, in their first order; methods in the results' order, then any others; tasks in
    their first order; lengths sorted (the ladder's, below the others, in their place)."""

    cells: dict
    keys: dict
    methods: tuple[str, ...]
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]

    @classmethod
    def of(cls, payload: dict, entries: list[dict], value: Callable[[dict], object]):
        """The table of ``entries`` (payload["trials"] items) with ``value(entry)`` in each cell."""
        cells, keys = {}, {}
        for e in entries:
            key = (str(e["task"]), str(e["trial"]))
            cells.setdefault((e["method"], int(e["length"])), {})[key] = value(e)
            keys.setdefault(int(e["length"]), {})[key] = None
        named = [r["method"] for r in payload["results"]]
        methods = named + [m for m in dict.fromkeys(e["method"] for e in entries) if m not in named]
        tasks = tuple(dict.fromkeys(str(e["task"]) for e in entries))
        return cls(cells, keys, tuple(methods), tasks, tuple(sorted(keys)))

    def values(self, method: str, length: int, task: str | None = None) -> list | None:
        """``method``'s values at ``length`` on ``task``'s questions (every task's with None), in the
        questions' order; None unless it has all of them."""
        cell = self.cells.get((method, length), {})
        wanted = [k for k in self.keys.get(length, ()) if task is None or k[0] == task]
        if not wanted or any(k not in cell for k in wanted):
            return None
        return [cell[k] for k in wanted]
