"""SelfExtend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
arxiv.org/abs/2401.01325; released code github.com/datamllab/LongLM)."""

from __future__ import annotations

import torch

from .. import _checks
from .base import Remap, View

__all__ = ["SelfExtend"]


class SelfExtend(Remap):
    """Neighbour attention inside ``window`` tokens, grouped attention beyond it.

    A pair at distance d < W keeps its positions; beyond, queries and keys take floor-divided positions,
    the query's shifted so that the two regimes meet: f(d) = i // G - j // G + W - W // G for query i and key
    j (the released code's ``group_query_position = i // G + W - W // G``, ``group_key_position = j // G``).
    Distances up to L - 1 become at most (L - 1) // G + W - W // G: a model trained at N tokens reaches about
    G (N - W) + W.

    Args:
        group_size: G, the positions each grouped position stands for (>= 1).
        window: W, the neighbour window in tokens (>= 1).
    """

    def __init__(self, group_size: int, window: int):
        self.group_size = _checks.positive_int("group_size", group_size, position=True)
        self.window = _checks.positive_int("window", window, position=True)

    def __repr__(self) -> str:
        return f"SelfExtend(group_size={self.group_size}, window={self.window})"

    def _shift(self) -> int:
        return self.window - self.window // self.group_size

    def views(self, i: torch.Tensor, j: torch.Tensor) -> tuple[View, ...]:
        g, w = self.group_size, self.window
        grouped_q = (torch.div(i, g, rounding_mode="floor") + self._shift()).double()
        return (
            View(i.double(), j.double(), 0, w),
            View(grouped_q, torch.div(j, g, rounding_mode="floor").double(), w, float("inf")),
        )

    def distance(self, d: float) -> float:
        # the largest remapped distance of a true distance d: query at d, key at 0
        return d if d < self.window else d // self.group_size + self._shift()

    def widen_hint(self) -> str:
        return "raise group_size (or lower window)"
