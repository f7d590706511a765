"""Rotation kernels. ``apply_rotary`` / ``apply_rotary_qk`` pick the fastest path for the tensors given.

Contract for every path: x (..., seq, head_dim); cos, sin (..., seq, rotary_dim/2) float32 (float64 for
float64 x), broadcastable against x's leading dimensions; returns x's dtype, dimensions past rotary_dim
unchanged. ``inplace=True`` writes into x (inference only: it refuses tensors that require grad).

Paths, chosen per call:

* CUDA tensors with Triton installed: :mod:`.rotary_triton`, one launch for q and k (any head counts).
* everything else (CPU): :mod:`.rotary_torch`, fused torch ops writing straight into the output.

Out of place, both run inside :class:`RotaryFunction`, a ``torch.autograd.Function`` whose backward is the
same rotation by -theta, so autograd never stores the intermediate products of the eager formula.
Nothing here compiles at import or on a first call (``torch.compile`` was measured and was no faster
than the direct path while costing ~30 s of first-call compile on a 2-core machine).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import torch

from .rotary_torch import rotate_into

__all__ = ["apply_rotary", "apply_rotary_qk", "triton_available", "RotaryFunction", "rotate_into"]


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


_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux
_HUGE_MIN_BYTES = 4 << 20


@functools.cache
def _madvise():
    """libc's madvise, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def empty_output(x: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(x)``; on the CPU, large outputs are advised onto transparent huge pages.

    A fresh multi-MiB CPU tensor is backed by new pages that fault in one 4 KiB page at a time on first
    write; on the machine this was measured on, that cost more than the rotation itself (64 MiB: ~36 ms to
    fault in against ~8 ms to copy). ``madvise(MADV_HUGEPAGE)`` on the untouched buffer lets the kernel back
    it with 2 MiB pages instead (measured ~14 ms). It only affects this buffer, and is skipped where
    unavailable (then it is plain ``empty_like``).
    """
    out = torch.empty_like(x)
    if out.device.type != "cpu" or out.nbytes < _HUGE_MIN_BYTES:
        return out
    madvise = _madvise()
    if madvise is not None:
        start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (out.data_ptr() + out.nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: a failure changes nothing
    return out


def _triton_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Reshape x and its tables for the Triton kernel: x (B, H, L, D) and cos (L, r/2) or (B, L, r/2), or None."""
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


def _use_triton(xs, cos) -> bool:
    return (
        all(x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1" for x in xs)
        and os.environ.get("POSENC_DISABLE_TRITON") != "1"
        and triton_available()
        and all(x.stride(-1) == 1 for x in xs)
    )


def _rotate(xs, cos, sin, layout: str, *, conjugate: bool = False, inplace: bool = False):
    """Rotate each tensor in xs; returns a tuple of outputs (the inputs themselves when inplace)."""
    if xs and _use_triton(xs, cos):
        prepared = [_triton_table(x, cos, sin) for x in xs]
        if all(p is not None for p in prepared):
            from .rotary_triton import rotary_qk_triton

            (q4, c, s) = prepared[0]
            k4 = prepared[1][0] if len(xs) == 2 else None
            same = k4 is not None and k4.shape[0] == q4.shape[0] and k4.shape[2] == q4.shape[2] and k4.dtype == q4.dtype
            if len(xs) == 1 or same:
                qo, ko = rotary_qk_triton(q4, k4, c, s, interleaved=layout == "interleaved", conjugate=conjugate, inplace=inplace)
                outs = (qo, ko)[: len(xs)]
            else:
                outs = tuple(
                    rotary_qk_triton(p[0], None, p[1], p[2], interleaved=layout == "interleaved",
                                     conjugate=conjugate, inplace=inplace)[0]
                    for p in prepared
                )
            return tuple(o.view(x.shape) for o, x in zip(outs, xs, strict=True))
    return tuple(rotate_into(x, cos, sin, x if inplace else empty_output(x), layout, conjugate) for x in xs)


class RotaryFunction(torch.autograd.Function):
    """Rotate tensors by theta; the gradient is the same rotation by -theta (the transpose of a rotation)."""

    @staticmethod
    def forward(ctx, cos, sin, layout, *xs):
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout
        ctx.metas = [(x.shape, x.dtype, x.device) for x in xs]
        ctx.set_materialize_grads(False)
        return _rotate(xs, cos, sin, layout)

    @staticmethod
    def backward(ctx, *grads):
        cos, sin = ctx.saved_tensors
        # An output that was not used has no gradient; rotating zeros gives zeros, so stand them in.
        grads = tuple(
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads, ctx.metas, strict=True)
        )
        return (None, None, None) + _rotate(grads, cos, sin, ctx.layout, conjugate=True)


def _check_inplace(xs) -> None:
    for name, x in xs:
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError(
                f"inplace=True overwrites {name}, which requires grad; inplace is for inference "
                "(use inplace=False to train, or run under torch.no_grad())"
            )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "interleaved", inplace: bool = False) -> torch.Tensor:
    """Rotate x (..., seq, head_dim) by the angles whose cos/sin are given (see the module contract)."""
    if inplace:
        _check_inplace([("x", x)])
        return _rotate((x,), cos, sin, layout, inplace=True)[0]
    return RotaryFunction.apply(cos, sin, layout, x)[0]


def apply_rotary_qk(q, k, cos, sin, *, layout: str = "interleaved", inplace: bool = False):
    """Rotate q and k (same positions, possibly different head counts) in one call; returns (q, k)."""
    if inplace:
        _check_inplace([("q", q), ("k", k)])
        return _rotate((q, k), cos, sin, layout, inplace=True)
    return RotaryFunction.apply(cos, sin, layout, q, k)
