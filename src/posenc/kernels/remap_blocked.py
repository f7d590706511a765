"""Remapped-distance attention on the CPU in O(L) memory, forward and backward, on torch's flash kernel.

Each view of a remap (:mod:`posenc.remap`) scores the pairs of one :class:`Band`: those whose distance
i - j, counted in units (1 token, or a chunk for Dual Chunk Attention), lies in [lo, hi). Queries go in
blocks; for a block at absolute positions [p0, p1) a band's keys split into at most three parts: keys every
query of the block takes from this band (no mask), and the two edges where the band starts or ends inside
the block (an additive mask of the block's rows by the edge's keys). Every part is one call of
``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` with the view's rotated queries and keys;
the parts are merged with their log-sum-exps, as in flash-attention and :mod:`posenc.kernels.alibi_blocked`.
A row with no key in a part gets a log-sum-exp of about -1e30 from its mask, so its weight in the merge is
exactly 0. Backward calls the kernel's own backward per part with the merged output and log-sum-exp, so
each part sees the global softmax: memory stays O(L) in backward too.

Attention sinks (a learned logit s_h per head, one more entry of every softmax row with no value) are one
more part with log-sum-exp s_h and output 0: the output shrinks by sigmoid(lse - s_h); in backward the
kernel's gradients with the merged log-sum-exp are exact, and s_h gets -sum_i P_sink(i) <dout_i, out_i>.

Grouped-query attention: k and v keep their own heads (the kernel reads head h // group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .blocked_common import flash as _flash
from .blocked_common import flash_bwd as _flash_bwd
from .blocked_common import work_dtype as _work_dtype

__all__ = ["BLOCK", "Band", "band_parts", "remap_attention_blocked"]

BLOCK = 512
_MASKED = -1e30  # finite: a row masked out of a whole part must not turn into NaN
_FAR = -(1 << 62)  # "from the first key on", for a band without an upper bound


@dataclass(frozen=True)
class Band:
    """The causal pairs (i, j), j <= i, whose distance in units, i // unit - j // unit, lies in [lo, hi):
    with unit 1 the distance itself, with a chunk length the chunk distance (Dual Chunk Attention)."""

    lo: int
    hi: float
    unit: int = 1

    def inside(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Boolean (..., len(i), len(j)): which pairs of absolute positions the band holds; ``i`` (..., q)
        and ``j`` (..., k) may carry leading dimensions that broadcast (rows of a batch)."""
        u = self.unit
        i, j = i[..., :, None], j[..., None, :]
        d = torch.div(i, u, rounding_mode="floor") - torch.div(j, u, rounding_mode="floor")
        return (d >= self.lo) & (d < self.hi) & (i >= j)

    def reach(self, p0: int, p1: int) -> tuple[int, int, int, int]:
        """For queries at absolute positions [p0, p1): the keys [first, last) that some query takes from
        the band, and [full0, full1) those that every query takes."""
        u, lo = self.unit, self.lo
        c0, c1 = p0 // u, (p1 - 1) // u
        first = _FAR if math.isinf(self.hi) else (c0 - int(self.hi) + 1) * u
        full0 = _FAR if math.isinf(self.hi) else (c1 - int(self.hi) + 1) * u
        last = min((c1 - lo + 1) * u, p1)  # causal: no key after the last query
        full1 = min((c0 - lo + 1) * u, p0 + 1)  # causal: no key after the first query
        return first, last, full0, full1


def band_parts(p0: int, p1: int, k_len: int, bands, offset: int):
    """(view, j0, j1, edge) for the queries at absolute positions [p0, p1), as key indices [j0, j1) (index =
    position - offset): each band's mask-free middle (edge False) and its edges (edge True)."""
    for view, band in enumerate(bands):
        first, last, full0, full1 = band.reach(p0, p1)
        if full0 >= full1:  # no key that every query takes: one masked range
            spans = [(first, last, True)]
        else:
            spans = [(first, full0, True), (full0, full1, False), (full1, last, True)]
        for j0, j1, edge in spans:
            j0, j1 = max(j0 - offset, 0), min(j1 - offset, k_len)
            if j0 < j1:
                yield view, j0, j1, edge


class _EdgeMasks:
    """The additive (1, 1, n, m) masks of band edges: 0 for the pairs the band holds, else about -1e30. A
    mask depends only on the band, the block's shape, where its keys start relative to its queries and
    where both starts fall in a unit, which repeats from block to block: each is built once per call."""

    def __init__(self, bands, dtype, device, offset: int):
        self.bands, self.dtype, self.device, self.offset = bands, dtype, device, offset
        self.made: dict[tuple, torch.Tensor] = {}

    def __call__(self, view: int, p0: int, p1: int, j0: int, j1: int) -> torch.Tensor:
        band, a0 = self.bands[view], j0 + self.offset  # a0: the first key's absolute position
        key = (view, p0 - a0, p0 % band.unit, a0 % band.unit, p1 - p0, j1 - j0)
        if key not in self.made:
            i = torch.arange(p0, p1, device=self.device)
            inside = band.inside(i, torch.arange(a0, a0 + j1 - j0, device=self.device))
            mask = torch.zeros(inside.shape, dtype=self.dtype, device=self.device)
            self.made[key] = mask.masked_fill_(~inside, _MASKED)[None, None]
        return self.made[key]


def _blocks(lq: int, lk: int, block: int, offset: int):
    """Query rows [t0, t1) and their absolute positions [p0, p1) (the queries are the last lq keys)."""
    shift = offset + lk - lq
    for t0 in range(0, lq, block):
        t1 = min(lq, t0 + block)
        yield t0, t1, shift + t0, shift + t1


class BlockedRemapAttention(torch.autograd.Function):
    """out = softmax over keys j <= i of (q_v(i) . k_v(j) * scale, v the view whose band holds (i, j)) @ v."""

    @staticmethod
    def forward(ctx, qs, ks, v, sinks, bands, scale: float, block: int, offset: int):
        ctx.dtypes = (qs.dtype, ks.dtype, v.dtype)
        work = _work_dtype(qs.dtype)
        qs, ks, vw = qs.to(work), ks.to(work), v.to(work)
        _, b, h, lq, _ = qs.shape
        lk = ks.shape[3]
        out = qs.new_empty((b, h, lq, v.shape[-1]))
        lse = qs.new_empty((b, h, lq))
        masks = _EdgeMasks(bands, work, qs.device, offset)
        sink = None if sinks is None else sinks.detach().to(work)[None, :, None]  # (1, H, 1)
        for t0, t1, p0, p1 in _blocks(lq, lk, block, offset):
            o_all = l_all = None
            for view, j0, j1, edge in band_parts(p0, p1, lk, bands, offset):
                mask = masks(view, p0, p1, j0, j1) if edge else None
                o_p, l_p = _flash(
                    qs[view, :, :, t0:t1], ks[view, :, :, j0:j1], vw[:, :, j0:j1], attn_mask=mask, scale=scale
                )
                l_p = l_p.to(work)
                if o_all is None:
                    o_all, l_all = o_p, l_p
                    continue
                # merge two normalised partial softmaxes: the new part's weight is sigmoid(l_p - l_all)
                o_all = torch.lerp(o_all, o_p, torch.sigmoid(l_p - l_all)[..., None])
                l_all = torch.logaddexp(l_all, l_p)
            if sink is not None:  # the sink's part: log-sum-exp s_h, output 0
                o_all = o_all * torch.sigmoid(l_all - sink)[..., None]
                l_all = torch.logaddexp(l_all, sink.expand_as(l_all))
            out[:, :, t0:t1] = o_all
            lse[:, :, t0:t1] = l_all
        ctx.save_for_backward(qs, ks, vw, out, lse, sinks)
        ctx.bands, ctx.scale, ctx.block, ctx.offset = bands, scale, block, offset
        return out.to(ctx.dtypes[0])

    @staticmethod
    def backward(ctx, grad_out):
        qs, ks, vw, out, lse, sinks = ctx.saved_tensors
        bands, scale, block, offset = ctx.bands, ctx.scale, ctx.block, ctx.offset
        work = qs.dtype
        go = grad_out.to(work).contiguous()
        lq, lk = qs.shape[3], ks.shape[3]
        dqs, dks, dv = torch.zeros_like(qs), torch.zeros_like(ks), torch.zeros_like(vw)
        masks = _EdgeMasks(bands, work, qs.device, offset)
        for t0, t1, p0, p1 in _blocks(lq, lk, block, offset):
            gob, ob, lb = go[:, :, t0:t1], out[:, :, t0:t1], lse[:, :, t0:t1].contiguous()
            for view, j0, j1, edge in band_parts(p0, p1, lk, bands, offset):
                mask = masks(view, p0, p1, j0, j1) if edge else None
                q_part, k_part, v_part = qs[view, :, :, t0:t1], ks[view, :, :, j0:j1], vw[:, :, j0:j1]
                dq, dk, dvp = _flash_bwd(
                    gob, q_part, k_part, v_part, ob, lb, 0.0, False, attn_mask=mask, scale=scale
                )
                dqs[view, :, :, t0:t1] += dq
                dks[view, :, :, j0:j1] += dk
                dv[:, :, j0:j1] += dvp
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            p_sink = torch.exp(sinks.detach().to(work)[None, :, None] - lse)  # (B, H, Lq)
            dsinks = -(p_sink * (go * out).sum(-1)).sum((0, 2)).to(sinks.dtype)
        return dqs.to(q_dtype), dks.to(k_dtype), dv.to(v_dtype), dsinks, None, None, None, None


def remap_attention_blocked(
    qs,
    ks,
    v,
    bands,
    *,
    scale: float,
    block: int | None = None,
    sinks: torch.Tensor | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """qs (V, B, H, Lq, D) and ks (V, B, Hk, Lk, D): the queries and keys rotated for each of V views;
    v (B, Hk, Lk, Dv); ``bands``: V :class:`Band` s, which between them hold every causal pair once;
    ``sinks`` (H,) or None; ``offset``: the first key's absolute position. Causal, the queries the last Lq
    of the keys. Returns (B, H, Lq, Dv); differentiable in qs, ks, v and sinks."""
    d, dv = qs.shape[-1], v.shape[-1]
    if d != dv:  # the kernel wants one head size: zero columns change no score and no output
        e = max(d, dv)
        qs, ks, v = F.pad(qs, (0, e - d)), F.pad(ks, (0, e - d)), F.pad(v, (0, e - dv))
    out = BlockedRemapAttention.apply(
        qs, ks, v, sinks, tuple(bands), float(scale), int(block or BLOCK), int(offset)
    )
    return out[..., :dv]
