"""ReRoPE and leaky ReRoPE (Su 2023, "Rectified Rotary Position Embeddings", kexue.fm/archives/9708;
released code github.com/bojone/rerope)."""

from __future__ import annotations

import math

import torch

from .. import _checks
from .base import Remap, View

__all__ = ["ReRoPE"]


class ReRoPE(Remap):
    """Distances inside ``window`` as trained; beyond it, all at ``window`` (or, leaky, growing slowly).

    f(d) = d for d < W; beyond, W (ReRoPE) or W + (d - W) / k with ``leaky=k`` (leaky ReRoPE): the far pairs
    score with queries at W and keys at 0 (ReRoPE), or with queries at i / k + W - W / k and keys at j / k
    (leaky), as the released code computes its second pass.

    Args:
        window: W (>= 1).
        leaky: k > 1, the slope divisor beyond the window; None for plain ReRoPE.
        log_n_length: the training length L_t for log-n query scaling, q times max(1, log(p + 1) / log L_t) at
            query position p (as the released code); None for none.
    """

    def __init__(self, window: int, leaky: float | None = None, log_n_length: int | None = None):
        self.window = _checks.positive_int("window", window, position=True)
        if leaky is not None:
            leaky = float(_checks.number("leaky", leaky, minimum=1, strict=True))
        self.leaky = leaky
        if log_n_length is not None:
            log_n_length = _checks.positive_int("log_n_length", log_n_length, minimum=2, position=True)
        self.log_n_length = log_n_length

    def __repr__(self) -> str:
        extra = "" if self.leaky is None else f", leaky={self.leaky:g}"
        extra += "" if self.log_n_length is None else f", log_n_length={self.log_n_length}"
        return f"ReRoPE(window={self.window}{extra})"

    def views(self, i: torch.Tensor, j: torch.Tensor) -> tuple[View, ...]:
        w, k = self.window, self.leaky
        if k is None:
            far = View(
                torch.full_like(i, w, dtype=torch.float64),
                torch.zeros_like(j, dtype=torch.float64),
                w,
                math.inf,
            )
        else:
            far = View(i.double() / k + w - w / k, j.double() / k, w, math.inf)
        return View(i.double(), j.double(), 0, w), far

    def distance(self, d: float) -> float:
        if d < self.window:
            return d
        return self.window if self.leaky is None else self.window + (d - self.window) / self.leaky

    def query_scale(self, i: torch.Tensor) -> torch.Tensor | None:
        if self.log_n_length is None:
            return None
        return (torch.log(i.double() + 1) / math.log(self.log_n_length)).clamp(min=1.0)

    def widen_hint(self) -> str:
        return "raise leaky (or lower window)"
