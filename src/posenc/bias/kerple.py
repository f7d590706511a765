"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge & Rudnicky 2022,
arxiv.org/abs/2205.09921)."""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from .base import ScoreBias

__all__ = ["KerpleBias"]

EPS = 1e-2  # the floor the paper's code clamps both parameters to


def _clamped(p: torch.Tensor, low: float, high: float | None) -> torch.Tensor:
    """p clamped in value, with p's gradient passed through unchanged (what the paper's code gets by clamping
    ``p.data`` in place before each use), without modifying the parameter."""
    return p + (p.clamp(low, high) - p).detach()


class KerpleBias(ScoreBias):
    """KERPLE's conditionally positive definite kernels as a score bias, per head h:

    * ``kind="log"``:   b_h(i, j) = -r1_h * log(1 + r2_h * |i - j|)
    * ``kind="power"``: b_h(i, j) = -r1_h * |i - j|^r2_h, 0 < r2_h <= 2

    Args:
        n_heads: attention heads.
        kind: "log" (the paper's best) or "power".

    Initialisation and positivity as in the paper's code (chijames/KERPLE, ``ParallelKerpleLog`` /
    ``ParallelKerplePower``): log: r1 ~ U(0, 2), r2 ~ U(0, 1); power: r1 ~ U(0, 1), r2 ~ U(0, 2); before each
    use both are clamped to >= 0.01 (r2 of the power kernel also to <= 2), the gradient passing through the
    clamp. Parameters ``r1`` and ``r2`` have shape (n_heads,).
    """

    def __init__(self, n_heads: int, kind: str = "log"):
        super().__init__()
        self.n_heads = _checks.positive_int("n_heads", n_heads, size=True)
        self.kernel = _checks.one_of("kind", kind, ("log", "power"))
        scale1, scale2 = (2.0, 1.0) if kind == "log" else (1.0, 2.0)
        self.r1 = nn.Parameter(torch.rand(n_heads) * scale1)
        self.r2 = nn.Parameter(torch.rand(n_heads) * scale2)

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(r1, r2) as used: clamped to [0.01, inf) (r2 of the power kernel to [0.01, 2])."""
        return _clamped(self.r1, EPS, None), _clamped(self.r2, EPS, 2.0 if self.kernel == "power" else None)

    def table(self, distance: torch.Tensor) -> torch.Tensor:
        r1, r2 = self.coefficients()
        d = distance.abs().to(r1.dtype)[None, :]
        if self.kernel == "log":
            return -r1[:, None] * torch.log1p(r2[:, None] * d)
        return -r1[:, None] * d.pow(r2[:, None])

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, kind={self.kernel!r}"
