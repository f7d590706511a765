"""Rotation kernels. ``apply_rotary`` / ``apply_rotary_qk`` rotate by given cos/sin on the fastest path.

Contract for every path: x (..., seq, head_dim); cos, sin (..., seq, rotary_dim/2) float32 (float64 for
float64 x), broadcastable against x's leading dimensions; returns x's dtype, dimensions past rotary_dim
unchanged. ``inplace=True`` writes into x (inference only: it refuses tensors that require grad).

The path is chosen in one place, :func:`.dispatch.choose_path` (its module has the table); the kernels
live beside it: :mod:`.native` (the compiled CPU op, one pass for q and k, built by ``make install``),
:mod:`.rotary_torch` (CPU without the op, and any device without Triton), :mod:`.rotary_triton` (CUDA,
one launch for q and k), all under :class:`~.rotary_function.RotaryFunction` out of place when autograd
records.
"""

from __future__ import annotations

import torch

from .dispatch import (
    SMALL_ELEMENTS,
    Path,
    check_inplace,
    choose_path,
    rotate_into,
    run,
    triton_available,
    uses_triton,
)
from .rotary_torch import rotate_eager, rotate_small

__all__ = [
    "SMALL_ELEMENTS",
    "Path",
    "apply_rotary",
    "apply_rotary_qk",
    "check_inplace",
    "choose_path",
    "rotate_eager",
    "rotate_into",
    "rotate_small",
    "run",
    "triton_available",
    "uses_triton",
]


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "interleaved",
    inplace: bool = False,
) -> torch.Tensor:
    """Rotate x (..., seq, head_dim) by the angles whose cos/sin are given (see the module contract)."""
    path = choose_path((x,), layout, cos=cos, inplace=inplace)
    return run(path, (x,), cos, sin, layout, inplace=inplace, names=("x",))[0]


def apply_rotary_qk(q, k, cos, sin, *, layout: str = "interleaved", inplace: bool = False):
    """Rotate q and k (same positions, possibly different head counts) in one call; returns (q, k)."""
    path = choose_path((q, k), layout, cos=cos, inplace=inplace)
    return run(path, (q, k), cos, sin, layout, inplace=inplace)
