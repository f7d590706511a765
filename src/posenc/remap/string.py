"""STRING (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
arxiv.org/abs/2410.18745): shifted rotary position embeddings."""

from __future__ import annotations

import math

import torch

from .. import _checks
from .base import Remap, View

__all__ = ["STRING"]

MAX_FACTOR = math.sqrt(_checks.MAX_SCALE)  # the factor on cos and sin; the scores take its square


class STRING(Remap):
    """Distances past ``shift`` move down to ``local_window`` onwards: the rarely trained far distances are
    replaced by well-trained ones.

    f(d) = d for d < N, else d - N + W: the far pairs score with queries at i - N + W and keys at j. The
    released code (github.com/HKUNLP/STRING) sets N = 0.33 L and W = 128 for a model trained at L, and scales
    cos and sin by 0.1 ln 2 + 1 as YaRN does, which multiplies every score by its square:
    ``attention_factor``.
    (Its two flash passes both count the pairs at d = N; here each pair is scored once.)

    Args:
        shift: N, where the shift starts (>= 1).
        local_window: W, the distance the shifted pairs start at (1 <= W <= N).
        attention_factor: the factor on cos and sin (scores times its square), in (0, 100]; 1.0 for none.
    """

    def __init__(self, shift: int, local_window: int, attention_factor: float = 1.0):
        self.shift = _checks.positive_int("shift", shift, position=True)
        self.local_window = _checks.positive_int("local_window", local_window, position=True)
        if self.local_window > self.shift:
            raise ValueError(
                f"local_window must be <= shift (the far distances move down, not up), got local_window="
                f"{local_window} > shift={shift}"
            )
        factor = float(_checks.number("attention_factor", attention_factor, minimum=0, strict=True))
        if factor > MAX_FACTOR:
            raise ValueError(
                f"attention_factor must be a finite number in (0, {MAX_FACTOR:g}] (its square multiplies "
                f"every score, as attention's scale does, up to {_checks.MAX_SCALE:g}), got "
                f"{attention_factor!r}"
            )
        self.attention_factor = factor

    def __repr__(self) -> str:
        extra = "" if self.attention_factor == 1.0 else f", attention_factor={self.attention_factor:g}"
        return f"STRING(shift={self.shift}, local_window={self.local_window}{extra})"

    def views(self, i: torch.Tensor, j: torch.Tensor) -> tuple[View, ...]:
        n, w = self.shift, self.local_window
        # queries before N have no key in the far band; clamping keeps their (unused) position >= 0
        far_q = (i.double() - n + w).clamp(min=0)
        return View(i.double(), j.double(), 0, n), View(far_q, j.double(), n, math.inf)

    def distance(self, d: float) -> float:
        return d if d < self.shift else d - self.shift + self.local_window

    def query_scale(self, i: torch.Tensor) -> torch.Tensor | None:
        if self.attention_factor == 1.0:
            return None
        return torch.full(i.shape, self.attention_factor**2, dtype=torch.float64, device=i.device)

    def widen_hint(self) -> str:
        return "raise shift"
