"""Remapped-distance attention on the CPU in O(L) memory, forward and backward, on torch's flash kernel.

Each view of a remap (:mod:`posenc.remap`) scores the pairs whose distance d = i - j lies in its band
[lo, hi). Queries go in blocks; for a block at absolute positions [p0, p1) a band's keys split into at most
three parts: keys every row of the block takes from this band (j in [p1 - hi, p0 - lo]: no mask), and the
two edges where the band starts or ends inside the block (at most n - 1 keys each: a (n, m) additive mask).
Every part is one call of ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` with the view's
rotated queries and keys; the parts are merged with their log-sum-exps, as in flash-attention and
:mod:`posenc.kernels.alibi_blocked`. A row with no key in a part gets a log-sum-exp of about -1e30 from its
mask, so its weight in the merge is exactly 0. Backward calls the kernel's own backward per part with the
merged output and log-sum-exp, so each part sees the global softmax: memory stays O(L) in backward too.

Attention sinks (a learned logit s_h per head, one more entry of every softmax row with no value) are one
more part with log-sum-exp s_h and output 0: the output shrinks by sigmoid(lse - s_h); in backward the
kernel's gradients with the merged log-sum-exp are exact, and s_h gets -sum_i P_sink(i) <dout_i, out_i>.

Grouped-query attention: k and v keep their own heads (the kernel reads head h // group).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .blocked_common import flash as _flash
from .blocked_common import flash_bwd as _flash_bwd
from .blocked_common import work_dtype as _work_dtype

__all__ = ["BLOCK", "remap_attention_blocked"]

BLOCK = 512
_MASKED = -1e30  # finite: a row masked out of a whole part must not turn into NaN


def _parts(p0: int, p1: int, k_len: int, bands):
    """(view, j0, j1, edge) for the block of query positions [p0, p1): the keys of each band, the mask-free
    middle (edge False) and the edges (edge True) where the band's bounds fall inside the block."""
    for view, (lo, hi) in enumerate(bands):
        lo = int(lo)
        first = 0 if math.isinf(hi) else p0 - int(hi) + 1  # the earliest key the band reaches from the block
        last = p1 - lo  # one past the latest
        full0 = 0 if math.isinf(hi) else p1 - int(hi)  # every row reaches keys from here ...
        full1 = p0 - lo + 1  # ... to here
        if full0 >= full1:  # the band is narrower than the block: one masked range
            spans = [(first, last, True)]
        else:
            spans = [(first, full0, True), (full0, full1, False), (full1, last, True)]
        for j0, j1, edge in spans:
            j0, j1 = max(j0, 0), min(j1, k_len)
            if j0 < j1:
                yield view, j0, j1, edge


class _EdgeMasks:
    """The additive (1, 1, n, m) masks of band edges: 0 where lo <= i - j < hi, else about -1e30. A mask
    depends only on the band, the block's shape and where its keys start relative to its queries, which
    repeats from block to block, so each is built once per call."""

    def __init__(self, bands, dtype, device):
        self.bands, self.dtype, self.device = bands, dtype, device
        self.made: dict[tuple, torch.Tensor] = {}

    def __call__(self, view: int, p0: int, p1: int, j0: int, j1: int) -> torch.Tensor:
        key = (view, p0 - j0, p1 - p0, j1 - j0)
        if key not in self.made:
            lo, hi = self.bands[view]
            d = torch.arange(p0 - j0, p1 - j0, device=self.device)[:, None] - torch.arange(
                j1 - j0, device=self.device
            )
            outside = (d < lo) | (d >= hi)
            mask = torch.zeros(outside.shape, dtype=self.dtype, device=self.device)
            self.made[key] = mask.masked_fill_(outside, _MASKED)[None, None]
        return self.made[key]


def _blocks(lq: int, lk: int, block: int):
    shift = lk - lq
    for t0 in range(0, lq, block):
        t1 = min(lq, t0 + block)
        yield t0, t1, shift + t0, shift + t1


class BlockedRemapAttention(torch.autograd.Function):
    """out = softmax over keys j <= i of (q_v(i) . k_v(j) * scale, v the view whose band holds i - j) @ v."""

    @staticmethod
    def forward(ctx, qs, ks, v, sinks, bands, scale: float, block: int):
        ctx.dtypes = (qs.dtype, ks.dtype, v.dtype)
        work = _work_dtype(qs.dtype)
        qs, ks, vw = qs.to(work), ks.to(work), v.to(work)
        _, b, h, lq, _ = qs.shape
        lk = ks.shape[3]
        out = qs.new_empty((b, h, lq, v.shape[-1]))
        lse = qs.new_empty((b, h, lq))
        masks = _EdgeMasks(bands, work, qs.device)
        sink = None if sinks is None else sinks.detach().to(work)[None, :, None]  # (1, H, 1)
        for t0, t1, p0, p1 in _blocks(lq, lk, block):
            o_all = l_all = None
            for view, j0, j1, edge in _parts(p0, p1, lk, bands):
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
        ctx.bands, ctx.scale, ctx.block = bands, scale, block
        return out.to(ctx.dtypes[0])

    @staticmethod
    def backward(ctx, grad_out):
        qs, ks, vw, out, lse, sinks = ctx.saved_tensors
        bands, scale, block = ctx.bands, ctx.scale, ctx.block
        work = qs.dtype
        go = grad_out.to(work).contiguous()
        lq, lk = qs.shape[3], ks.shape[3]
        dqs, dks, dv = torch.zeros_like(qs), torch.zeros_like(ks), torch.zeros_like(vw)
        masks = _EdgeMasks(bands, work, qs.device)
        for t0, t1, p0, p1 in _blocks(lq, lk, block):
            gob, ob, lb = go[:, :, t0:t1], out[:, :, t0:t1], lse[:, :, t0:t1].contiguous()
            for view, j0, j1, edge in _parts(p0, p1, lk, bands):
                mask = masks(view, p0, p1, j0, j1) if edge else None
                dq, dk, dvp = _flash_bwd(
                    gob,
                    qs[view, :, :, t0:t1],
                    ks[view, :, :, j0:j1],
                    vw[:, :, j0:j1],
                    ob,
                    lb,
                    0.0,
                    False,
                    attn_mask=mask,
                    scale=scale,
                )
                dqs[view, :, :, t0:t1] += dq
                dks[view, :, :, j0:j1] += dk
                dv[:, :, j0:j1] += dvp
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            p_sink = torch.exp(sinks.detach().to(work)[None, :, None] - lse)  # (B, H, Lq)
            dsinks = -(p_sink * (go * out).sum(-1)).sum((0, 2)).to(sinks.dtype)
        return dqs.to(q_dtype), dks.to(k_dtype), dv.to(v_dtype), dsinks, None, None, None


def remap_attention_blocked(
    qs, ks, v, bands, *, scale: float, block: int | None = None, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """qs (V, B, H, Lq, D) and ks (V, B, Hk, Lk, D): the queries and keys rotated for each of V views;
    v (B, Hk, Lk, Dv); ``bands``: V (lo, hi) distance bands partitioning [0, inf); ``sinks`` (H,) or None.
    Causal, the queries the last Lq of the keys. Returns (B, H, Lq, Dv); differentiable in qs, ks, v and
    sinks."""
    d, dv = qs.shape[-1], v.shape[-1]
    if d != dv:  # the kernel wants one head size: zero columns change no score and no output
        e = max(d, dv)
        qs, ks, v = F.pad(qs, (0, e - d)), F.pad(ks, (0, e - d)), F.pad(v, (0, e - dv))
    out = BlockedRemapAttention.apply(qs, ks, v, sinks, tuple(bands), float(scale), int(block or BLOCK))
    return out[..., :dv]
