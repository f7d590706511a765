"""Rotation kernels. ``apply_rotary`` / ``apply_rotary_qk`` pick the fastest path for the tensors given.

Contract for every path: x (..., seq, head_dim); cos, sin (..., seq, rotary_dim/2) float32 (float64 for
float64 x), broadcastable against x's leading dimensions; returns x's dtype, dimensions past rotary_dim
unchanged. ``inplace=True`` writes into x.
"""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "interleaved", inplace: bool = False) -> torch.Tensor:
    from ..rotary import rotate_eager

    out = rotate_eager(x, cos, sin, layout)
    if inplace:
        x.copy_(out)
        return x
    return out


def apply_rotary_qk(q, k, cos, sin, *, layout: str = "interleaved", inplace: bool = False):
    return (
        apply_rotary(q, cos, sin, layout=layout, inplace=inplace),
        apply_rotary(k, cos, sin, layout=layout, inplace=inplace),
    )
