"""Rotation kernels. ``apply_rotary`` / ``apply_rotary_qk`` pick the fastest path for the tensors given.

Contract for every path: x (..., seq, head_dim); cos, sin (..., seq, rotary_dim/2) float32 (float64 for
float64 x), broadcastable against x's leading dimensions; returns x's dtype, dimensions past rotary_dim
unchanged. ``inplace=True`` writes into x (inference only: it refuses tensors that require grad).

Paths, chosen per call:

* CUDA tensors with Triton installed: :mod:`.rotary_triton`, one launch for q and k (any head counts).
* everything else (CPU): :mod:`.rotary_torch`, fused torch ops writing straight into the output.

Out of place, both run inside :class:`~.rotary_function.RotaryFunction`, whose backward is the same
rotation by -theta. Nothing here compiles at import or on a first call (docs/fast-paths.md has the
measurements behind that choice). This module only chooses a path; the kernels live beside it.
"""

from __future__ import annotations

import functools
import os

import torch

from .. import _checks
from .memory import empty_output
from .rotary_function import RotaryFunction
from .rotary_torch import rotate_eager, rotate_into, rotate_small

__all__ = [
    "apply_rotary",
    "apply_rotary_qk",
    "check_inplace",
    "rotate",
    "rotate_eager",
    "rotate_into",
    "rotate_small",
    "triton_available",
    "uses_triton",
]


@functools.cache
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def triton_available() -> bool:
    """True when Triton imports and a CUDA device exists (or the Triton interpreter is on)."""
    return _triton_importable() and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")


def _triton_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """x (B, H, L, D) and its tables (L, r/2) or (B, L, r/2) as the Triton kernel takes them, or None."""
    seq = x.shape[-2]
    if x.dim() == 4:
        x4 = x
    elif x.dim() == 3 and cos.dim() == 2:
        x4 = x.unsqueeze(0)
    else:
        return None
    if cos.dim() == 2 and cos.shape[0] == seq:
        return x4, cos, sin
    if cos.dim() == 4 and cos.shape[1] == 1 and cos.shape[2] == seq and cos.shape[0] in (1, x4.shape[0]):
        c, s = cos[:, 0], sin[:, 0]
        if c.shape[0] != x4.shape[0]:
            return x4, c[0], s[0]
        return x4, c, s
    return None


def uses_triton(xs) -> bool:
    """Whether these tensors rotate on the Triton kernel: CUDA tensors (or the interpreter, in tests)."""
    if not all(x.is_cuda for x in xs) and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return (
        os.environ.get("POSENC_DISABLE_TRITON") != "1"
        and triton_available()
        and all(x.stride(-1) == 1 for x in xs)
    )


def rotate(xs, cos, sin, layout: str, *, conjugate: bool = False, inplace: bool = False):
    """Rotate each tensor in xs; returns a tuple of outputs (the inputs themselves when inplace)."""
    if xs and uses_triton(xs):
        prepared = [_triton_table(x, cos, sin) for x in xs]
        if all(p is not None for p in prepared):
            from .rotary_triton import rotary_qk_triton

            (q4, c, s) = prepared[0]
            k4 = prepared[1][0] if len(xs) == 2 else None
            same = (
                k4 is not None
                and k4.shape[0] == q4.shape[0]
                and k4.shape[2] == q4.shape[2]
                and k4.dtype == q4.dtype
            )
            if len(xs) == 1 or same:
                qo, ko = rotary_qk_triton(
                    q4, k4, c, s, interleaved=layout == "interleaved", conjugate=conjugate, inplace=inplace
                )
                outs = (qo, ko)[: len(xs)]
            else:
                outs = tuple(
                    rotary_qk_triton(
                        p[0],
                        None,
                        p[1],
                        p[2],
                        interleaved=layout == "interleaved",
                        conjugate=conjugate,
                        inplace=inplace,
                    )[0]
                    for p in prepared
                )
            return tuple(o.view(x.shape) for o, x in zip(outs, xs, strict=True))
    return tuple(rotate_into(x, cos, sin, x if inplace else empty_output(x), layout, conjugate) for x in xs)


def check_inplace(xs) -> None:
    """Refuse ``inplace=True`` for any (name, tensor) of ``xs`` that requires grad."""
    for name, x in xs:
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError(
                f"inplace=True overwrites {name}, which requires grad; inplace is for inference "
                "(use inplace=False to train, or run under torch.no_grad())"
            )


def _rotation(cos, sin, layout: str):
    """``rotate(xs, conjugate=False)`` for :class:`RotaryFunction`: the fused path, and the differentiable
    one when a backward pass itself records a graph (double backward, ``create_graph=True``)."""

    def rotation(xs, conjugate: bool = False):
        if conjugate and torch.is_grad_enabled():
            return tuple(rotate_eager(x, cos, -sin, layout) for x in xs)
        return rotate(xs, cos, sin, layout, conjugate=conjugate)

    return rotation


def _apply(xs, names, cos, sin, layout: str, inplace: bool):
    if _checks.tracing():
        # Under torch.compile / torch.export: plain differentiable ops, which the compiler fuses into one
        # kernel per tensor (and which need no autograd.Function or out= buffers the tracer cannot follow).
        outs = tuple(rotate_eager(x, cos, sin, layout) for x in xs)
        return tuple(x.copy_(o) for x, o in zip(xs, outs, strict=True)) if inplace else outs
    if inplace:
        check_inplace(list(zip(names, xs, strict=True)))
        return rotate(xs, cos, sin, layout, inplace=True)
    return RotaryFunction.apply(_rotation(cos, sin, layout), *xs)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "interleaved",
    inplace: bool = False,
) -> torch.Tensor:
    """Rotate x (..., seq, head_dim) by the angles whose cos/sin are given (see the module contract)."""
    return _apply((x,), ("x",), cos, sin, layout, inplace)[0]


def apply_rotary_qk(q, k, cos, sin, *, layout: str = "interleaved", inplace: bool = False):
    """Rotate q and k (same positions, possibly different head counts) in one call; returns (q, k)."""
    return _apply((q, k), ("q", "k"), cos, sin, layout, inplace)
