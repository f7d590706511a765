"""The one place a RoPE rotation's kernel is chosen (:func:`choose_path`), and the runner (:func:`run`).

Every rotation in posenc (``RotaryEmbedding``, xPos, M-RoPE, axial RoPE, re-rotating a KV cache, and the
public ``apply_rotary`` / ``apply_rotary_qk``) is ``run(choose_path(...), ...)``: one decision per call,
read off the tensors, then a kernel that decides nothing more. The paths, first match wins:

========  ==========================================================================  =======================
path      when                                                                        kernel
========  ==========================================================================  =======================
EAGER     torch.compile / torch.export is tracing; a backward pass that itself        ``rotate_eager``: plain
          records a graph (double backward); tables that require grad (learnable      differentiable ops
          frequencies)
NATIVE    CPU tensors with a unit last stride, one dtype of float32/float64/bfloat16/  ``native.rotary``: one
          float16, posenc's compiled op built (``make install``), not under Triton's  C++ pass for q and k
          interpreter
SMALL     the caller offers decode rows (a static schedule, consecutive positions,    ``rotate_small``: one
          every dimension rotated), on the CPU, q and k together at most              to three ops
          ``SMALL_ELEMENTS``, one dtype, not float64
TRITON    CUDA tensors with Triton (or its interpreter), unit last stride, tables     ``rotary_qk_triton``:
          the kernel takes ((seq, r/2), or per sequence)                              one launch for q and k
COMPLEX   interleaved float32/float64 pairs that are complex numbers in memory        ``rotate_complex``
WHOLE     out of place, float32/float64                                               ``rotate_whole``
BLOCKED   anything else: in place, bfloat16/float16                                   ``rotate_blocked``
========  ==========================================================================  =======================

Out of place, NATIVE, TRITON, COMPLEX, WHOLE and BLOCKED run inside :class:`~.rotary_function.RotaryFunction`,
whose backward rotates the gradients by -theta on the path :func:`choose_path` picks for them (their strides
are not the inputs'), when autograd could need one; EAGER and SMALL are differentiable as they are. Nothing
here compiles at import or on a first call: the NATIVE op is built by ``make install`` or not used
(docs/fast-paths.md has the measurements behind each path and threshold).
"""

from __future__ import annotations

import enum
import functools
import os
from itertools import repeat

import torch

from .. import _checks
from . import native
from .memory import empty_output
from .rotary_function import RotaryFunction
from .rotary_torch import (
    complex_viewable,
    prepare,
    rotate_blocked,
    rotate_complex,
    rotate_eager,
    rotate_small,
    rotate_whole,
)

__all__ = [
    "SMALL_ELEMENTS",
    "Path",
    "check_inplace",
    "choose_path",
    "rotate_into",
    "run",
    "triton_available",
    "uses_triton",
]

# At or below this many elements in q and k together, a call offered decode rows takes the small path:
# there the time is per-op overhead, not memory traffic (crossover measured in docs/fast-paths.md).
SMALL_ELEMENTS = 1 << 20


class Path(enum.Enum):
    """A rotation kernel; see the module's table for when each is chosen."""

    EAGER = "eager"
    NATIVE = "native"
    SMALL = "small"
    TRITON = "triton"
    COMPLEX = "complex"
    WHOLE = "whole"
    BLOCKED = "blocked"


def choose_path(
    xs: tuple[torch.Tensor, ...],
    layout: str,
    *,
    cos: torch.Tensor | None = None,
    rows: bool = False,
    inplace: bool = False,
    conjugate: bool = False,
) -> Path:
    """The kernel for rotating ``xs``, one tensor or (q, k), each (..., seq, head_dim): the only decision.

    Args:
        layout: "interleaved" or "half".
        cos: the cos table the rotation will use, or None for a (seq, r/2) table of consecutive positions
            (what a caller offering ``rows`` will look up if the small path is not taken).
        rows: the caller can hand :func:`rotate_small` its decode rows instead of cos/sin.
        inplace: the outputs are the inputs.
        conjugate: the backward pass (a rotation by -theta).
    """
    if _checks.tracing():
        return Path.EAGER
    if (conjugate or (cos is not None and cos.requires_grad)) and torch.is_grad_enabled():
        return Path.EAGER
    first, last = xs[0], xs[-1]  # one tensor, or q and k
    if _native_fits(xs, cos) and not uses_triton(xs):  # the Triton interpreter takes CPU tensors too
        return Path.NATIVE
    if (
        rows
        and first.dtype == last.dtype != torch.float64
        and first.device.type == "cpu"
        and first.numel() + (last.numel() if len(xs) > 1 else 0) <= SMALL_ELEMENTS
    ):
        return Path.SMALL
    if uses_triton(xs) and all(_triton_table(x, cos) for x in xs):
        return Path.TRITON
    return _torch_path(xs, layout, inplace)


_NATIVE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _native_fits(xs, cos: torch.Tensor | None) -> bool:
    """The NATIVE row: CPU tensors of one supported dtype, unit last stride, 2-8 dimensions, op loaded."""
    dtype = xs[0].dtype
    if dtype not in _NATIVE_DTYPES or (cos is not None and not cos.is_cpu):
        return False
    for x in xs:  # spelled out: a decode step pays for every attribute read here
        if not x.is_cpu or x.dtype != dtype or x.stride(-1) != 1 or not 2 <= x.dim() <= 8:
            return False
    return native.available()


def _torch_path(xs, layout: str, inplace: bool) -> Path:
    """The last three rows of the table: which plain-torch kernel."""
    first, last = xs[0], xs[-1]
    full = first.dtype == last.dtype and first.dtype in (torch.float32, torch.float64)
    if full and layout == "interleaved" and complex_viewable(first) and complex_viewable(last):
        return Path.COMPLEX
    return Path.WHOLE if full and not inplace else Path.BLOCKED


def run(
    path: Path,
    xs: tuple[torch.Tensor, ...],
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    layout: str,
    *,
    inplace: bool = False,
    names: tuple[str, ...] = ("q", "k"),
    rows: tuple[tuple[torch.Tensor, ...], ...] = (),
) -> tuple[torch.Tensor, ...]:
    """Rotate each tensor of ``xs`` on ``path``; returns the outputs (the inputs themselves when inplace).

    cos, sin: (..., seq, rotary_dim/2) float32 (float64 for float64 x), broadcastable against each x's
    leading dimensions; ``rows``: one :meth:`~posenc.rope.table.CosSinTable.small_rows` per tensor, for the
    SMALL path (which takes no cos/sin). ``names`` name the tensors in the in-place refusal.
    """
    if inplace and path is not Path.EAGER:
        check_inplace(zip(names, xs, strict=True))
    if path is Path.SMALL:  # first, and spelled out: a decode step's whole cost is calls like these
        first = rotate_small(xs[0], rows[0], layout, inplace)
        return (first,) if len(xs) == 1 else (first, rotate_small(xs[1], rows[1], layout, inplace))
    if path is Path.EAGER:
        outs = tuple(map(rotate_eager, xs, repeat(cos), repeat(sin), repeat(layout)))
    elif inplace or not (torch.is_grad_enabled() and any(x.requires_grad for x in xs)):
        return _rotation(path, cos, sin, layout, xs, inplace=inplace)  # no graph to record: no Function
    else:
        return RotaryFunction.apply(functools.partial(_rotation, path, cos, sin, layout), *xs)
    # in place under a tracer, the result is copied back: the only in-place form a graph can hold
    return tuple(map(torch.Tensor.copy_, xs, outs)) if inplace else outs


def _rotation(path: Path, cos, sin, layout: str, xs, conjugate: bool = False, inplace: bool = False):
    """Run a non-differentiable kernel: ``RotaryFunction``'s forward on ``path``, its backward on the path
    chosen for the gradients (whose strides are not the inputs'; EAGER when the backward records a graph),
    or an in-place rotation."""
    if conjugate:
        path = choose_path(xs, layout, cos=cos, conjugate=True)
        if path is Path.EAGER:
            return tuple(map(rotate_eager, xs, repeat(cos), repeat(-sin), repeat(layout)))
    if path is Path.TRITON:
        return _run_triton(xs, cos, sin, layout, conjugate, inplace)
    if path is Path.NATIVE:
        return _run_native(xs, cos, sin, layout, conjugate, inplace)
    kernel = _CPU_KERNELS[path]
    outs = []
    for x in xs:
        out = x if inplace else empty_output(x)
        tables = prepare(x, cos, sin, out, conjugate)
        outs.append(out if tables is None else kernel(x, *tables, out, layout))
    return tuple(outs)


def rotate_into(x, cos, sin, out, layout: str = "interleaved", conjugate: bool = False) -> torch.Tensor:
    """Write the rotation of x into ``out`` (x itself: in place) with a plain-torch kernel, without
    autograd; ``conjugate`` rotates by -theta. Returns out."""
    tables = prepare(x, cos, sin, out, conjugate)
    if tables is None:
        return out
    return _CPU_KERNELS[_torch_path((x,), layout, out is x)](x, *tables, out, layout)


_CPU_KERNELS = {Path.COMPLEX: rotate_complex, Path.WHOLE: rotate_whole, Path.BLOCKED: rotate_blocked}


def _run_native(xs, cos, sin, layout: str, conjugate: bool, inplace: bool):
    """One call of the compiled op for every tensor of xs; tables in the work dtype, on the CPU."""
    work = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    if cos.dtype != work:  # a no-op .to still costs a microsecond, a tenth of a decode step here
        cos, sin = cos.to(work), sin.to(work)
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:  # the op reads table rows as contiguous runs
        cos, sin = cos.contiguous(), sin.contiguous()
    outs = xs if inplace else tuple(map(empty_output, xs))
    native.rotary(xs, outs, cos, sin, layout == "interleaved", conjugate)
    return outs


def check_inplace(xs) -> None:
    """Refuse ``inplace=True`` for any (name, tensor) of ``xs`` that requires grad."""
    for name, x in xs:
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError(
                f"inplace=True overwrites {name}, which requires grad; inplace is for inference "
                "(use inplace=False to train, or run under torch.no_grad())"
            )


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


def uses_triton(xs) -> bool:
    """Whether these tensors are on a Triton device: CUDA tensors (or any, under the interpreter), with a
    unit last stride, Triton available and not disabled by ``POSENC_DISABLE_TRITON=1``."""
    if not (xs[0].is_cuda and all(x.is_cuda for x in xs)) and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return (
        os.environ.get("POSENC_DISABLE_TRITON") != "1"
        and triton_available()
        and all(x.stride(-1) == 1 for x in xs)
    )


def _triton_table(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None = None):
    """x (B, H, L, D) and its tables (L, r/2) or (B, L, r/2) as the Triton kernel takes them, or None
    (cos None: a (L, r/2) table, known to fit)."""
    seq = x.shape[-2]
    if x.dim() == 4:
        x4 = x
    elif x.dim() == 3 and (cos is None or cos.dim() == 2):
        x4 = x.unsqueeze(0)
    else:
        return None
    if cos is None or (cos.dim() == 2 and cos.shape[0] == seq):
        return x4, cos, sin
    if cos.dim() == 4 and cos.shape[1] == 1 and cos.shape[2] == seq and cos.shape[0] in (1, x4.shape[0]):
        c, s = cos[:, 0], sin[:, 0] if sin is not None else None
        if c.shape[0] != x4.shape[0]:
            return x4, c[0], s[0] if s is not None else None
        return x4, c, s
    return None


def _run_triton(xs, cos, sin, layout: str, conjugate: bool, inplace: bool):
    """One Triton launch for q and k when they share batch, length and dtype, else one per tensor."""
    from .rotary_triton import rotary_qk_triton

    prepared = [_triton_table(x, cos, sin) for x in xs]
    flags = {"interleaved": layout == "interleaved", "conjugate": conjugate, "inplace": inplace}
    q4, c, s = prepared[0]
    k4 = prepared[1][0] if len(xs) == 2 else None
    if len(xs) == 1 or (k4.shape[0] == q4.shape[0] and k4.shape[2] == q4.shape[2] and k4.dtype == q4.dtype):
        outs = rotary_qk_triton(q4, k4, c, s, **flags)[: len(xs)]
    else:
        outs = tuple(rotary_qk_triton(p[0], None, p[1], p[2], **flags)[0] for p in prepared)
    return tuple(o.view(x.shape) for o, x in zip(outs, xs, strict=True))
