"""Fused RoPE rotation in plain torch ops, for the CPU (and any device without Triton).

RoPE (Su et al. 2021, arxiv.org/abs/2104.09864) rotates pair k of x at position p by theta = p * omega_k:
(a, b) -> (a cos - b sin, a sin + b cos). The kernels below decide nothing: :func:`posenc.kernels.dispatch.
choose_path` picks one per call. The three for tensors of any size write straight into a preallocated
output and never allocate a temporary the size of x:

* :func:`rotate_complex`: interleaved pairs in float32/float64 are complex numbers already laid out in
  memory, so ``view_as_complex(x) * (cos + i sin)`` is one vectorised, multi-threaded pass over x (read x
  once, write out once: the memory-bandwidth floor). In place it is a single ``mul_``.
* :func:`rotate_whole`: out of place in float32/float64 otherwise (the "half" layout, odd strides): four
  whole-tensor ops, a * cos and b * cos into out, then one fused multiply-add per pair member (about 2.5
  passes over memory).
* :func:`rotate_blocked`: in place, and bfloat16/float16 (converted through a float32 scratch so that the
  arithmetic is float32 with one rounding at the end): walk the sequence in blocks of ~512 Ki elements that
  stay in cache, a handful of out=/in-place ops per block, so main memory sees about one read and one write.

:func:`rotate_small` is the decode-sized path (one to three differentiable ops on memoised rows).
Besides the output a call allocates only O(seq * rotary_dim) tables and one cache-sized scratch block.
:func:`rotate_eager` is the readable version of the same rotation that every kernel is tested against.
"""

from __future__ import annotations

import torch

from .blocked_common import work_dtype as _work_dtype

# Elements (leading dims x rows x rotary_dim) per block: 2 MiB of float32, so a block of x, of out and the
# scratch stay in L3. Larger than L2 on purpose: every op pays a thread barrier, so fewer, larger ops win
# (measurements: docs/fast-paths.md).
_BLOCK_ELEMS = 1 << 19


def rotate_eager(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved"
) -> torch.Tensor:
    """Plain-torch rotation, the readable version every kernel is tested against.

    Args:
        x: (..., seq, head_dim).
        cos, sin: (..., seq, rotary_dim / 2), broadcastable against x's leading dimensions.
        layout: "interleaved" pairs (2i, 2i+1); "half" pairs (i, i + rotary_dim/2).

    Returns:
        x with its first rotary_dim dimensions rotated, in x's dtype. Arithmetic is float32 (float64 for
        float64 x).
    """
    r = 2 * cos.shape[-1]
    work = _work_dtype(x.dtype)
    a, b = (t.to(work) for t in _pairs(x, r, layout))
    cos, sin = cos.to(work), sin.to(work)
    first, second = a * cos - b * sin, a * sin + b * cos
    if layout == "interleaved":
        out = torch.stack((first, second), dim=-1).flatten(-2)
    else:
        out = torch.cat((first, second), dim=-1)
    out = out.to(x.dtype)
    if r == x.shape[-1]:  # no empty tail to concatenate (its strides would pin symbolic shapes under compile)
        return out
    return torch.cat((out, x[..., r:]), dim=-1)


def rotate_small(
    x: torch.Tensor, rows: tuple[torch.Tensor, ...], layout: str, inplace: bool = False
) -> torch.Tensor:
    """Rotate x in one to three differentiable ops: the cheapest path for a small tensor (a decode step),
    where per-op overhead, not memory traffic, sets the time.

    Args:
        x: (..., seq, rotary_dim), every dimension rotated; any float dtype but float64 (float32 arithmetic).
        rows: from :meth:`posenc.rope.table.CosSinTable.small_rows` for this layout: (cos2, sin2) for "half",
            x * cos2 + swap_halves(x) * sin2; (cos + i sin,) for "interleaved", a complex multiply.
        inplace: write the result into x and return it (inference): as many ops as out of place, never a
            copy more (a float32 x is multiplied in place, a 16-bit one gets its float32 result in the one
            cast that out of place would make anyway).
    """
    own = x.dtype == torch.float32
    work = x if own else x.float()
    if layout == "half":  # the halves trade places: one roll
        cos2, sin2 = rows
        rolled = work.roll(x.shape[-1] // 2, -1)
        if inplace and own:
            return x.mul_(cos2).addcmul_(rolled, sin2)
        out = torch.addcmul(work * cos2, rolled, sin2)
    else:
        if not complex_viewable(work):  # a strided last dimension: pairs are complex numbers only in a copy
            work = work.contiguous()
        pairs = torch.view_as_complex(work.unflatten(-1, (-1, 2)))
        if inplace and own and work is x:
            pairs.mul_(rows[0])
            return x
        out = torch.view_as_real(pairs * rows[0]).flatten(-2)
    if inplace:
        return x.copy_(out)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def complex_viewable(x: torch.Tensor) -> bool:
    """True when the rotary slice of x can be reinterpreted as complex numbers without a copy."""
    if x.stride(-1) != 1 or x.storage_offset() % 2:
        return False
    return all(s % 2 == 0 for s, n in zip(x.stride()[:-1], x.shape[:-1], strict=True) if n > 1)


def _pairs(x: torch.Tensor, r: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the first and second member of each rotated pair: (..., seq, r/2) each."""
    if layout == "interleaved":
        return x[..., 0:r:2], x[..., 1:r:2]
    return x[..., : r // 2], x[..., r // 2 : r]


def prepare(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, conjugate: bool):
    """What every kernel below does first: copy the unrotated tail into ``out`` (when it is not x) and
    return cos and sin in x's working dtype, sin negated for ``conjugate`` (a rotation by -theta: the
    backward pass); None when there is nothing to rotate.

    Every kernel ``kernel(x, cos, sin, out, layout)`` then takes:
        x: (..., seq, head_dim), any float dtype, any strides.
        cos, sin: (..., seq, rotary_dim/2), from here, broadcastable against x's leading dims.
        out: shaped like x, same dtype, or x itself (in place).
    """
    h = cos.shape[-1]
    if out is not x and 2 * h < x.shape[-1]:
        out[..., 2 * h :].copy_(x[..., 2 * h :])
    if x.numel() == 0 or h == 0:
        return None
    work = _work_dtype(x.dtype)
    return cos.to(work), (-sin if conjugate else sin).to(work)


def rotate_complex(x, cos, sin, out, layout):
    """Interleaved float32/float64 pairs are complex numbers: one multiply by cos + i sin."""
    h = cos.shape[-1]
    r = 2 * h
    table = torch.complex(cos, sin)  # (..., seq, r/2)
    xc = torch.view_as_complex(x[..., :r].unflatten(-1, (h, 2)))
    if out is x:
        xc.mul_(table)
    else:
        torch.mul(xc, table, out=torch.view_as_complex(out[..., :r].unflatten(-1, (h, 2))))
    return out


def rotate_whole(x, cos, sin, out, layout):
    """Out of place in float32/float64: a * cos and b * cos into out, then one fused multiply-add per member.

    About 2.5 passes over x instead of the blocked path's one, but four thread barriers instead of hundreds,
    which wins on a loaded machine (docs/fast-paths.md).
    """
    r = 2 * cos.shape[-1]
    a, b = _pairs(x, r, layout)
    oa, ob = _pairs(out, r, layout)
    torch.mul(a, cos, out=oa)
    torch.mul(b, cos, out=ob)
    oa.addcmul_(b, -sin)
    ob.addcmul_(a, sin)
    return out


def rotate_blocked(x, cos, sin, out, layout):
    """In place, or half precision: walk the sequence axis in blocks that stay in cache.

    float32/float64 compute straight into out (in place, one member of each pair is saved first);
    bfloat16/float16 go through a float32 scratch block, so the arithmetic is float32 with one rounding.
    """
    h = cos.shape[-1]
    r, seq, lead = 2 * h, x.shape[-2], x.shape[:-2]
    work = cos.dtype
    rows = max(1, min(seq, _BLOCK_ELEMS // (max(1, x[..., 0, 0].numel()) * r)))
    nsin = -sin
    same = x.dtype == work
    if same:
        a, b = _pairs(x, r, layout)
        oa, ob = _pairs(out, r, layout)
        saved = torch.empty(*lead, rows, h, dtype=work, device=x.device) if out is x else None
    else:
        src = torch.empty(*lead, rows, r, dtype=work, device=x.device)
        dst = torch.empty(*lead, rows, r, dtype=work, device=x.device)
    for s0 in range(0, seq, rows):
        s1 = min(seq, s0 + rows)
        n = s1 - s0
        c, sn, ns = cos[..., s0:s1, :], sin[..., s0:s1, :], nsin[..., s0:s1, :]
        if same:
            xa, xb, ya, yb = a[..., s0:s1, :], b[..., s0:s1, :], oa[..., s0:s1, :], ob[..., s0:s1, :]
            sa = xa if saved is None else saved[..., :n, :].copy_(xa)  # in place, a' overwrites a
            torch.mul(xa, c, out=ya).addcmul_(xb, ns)  # a' = a cos - b sin  (b still intact)
            torch.mul(xb, c, out=yb).addcmul_(sa, sn)  # b' = b cos + a sin  (a from the saved copy)
            continue
        sb, db = src[..., :n, :], dst[..., :n, :]
        sb.copy_(x[..., s0:s1, :r])
        if layout == "interleaved":  # scratch is contiguous, so the pairs are complex numbers
            torch.view_as_complex(sb.unflatten(-1, (h, 2))).mul_(torch.complex(c, sn))
            db = sb
        else:
            xa, xb = sb[..., :h], sb[..., h:]
            torch.mul(xa, c, out=db[..., :h]).addcmul_(xb, ns)
            torch.mul(xb, c, out=db[..., h:]).addcmul_(xa, sn)
        out[..., s0:s1, :r].copy_(db)
    return out
