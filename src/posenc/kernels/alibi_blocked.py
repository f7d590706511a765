"""ALiBi attention in O(L) memory per head on the CPU, forward and backward, on torch's flash kernel.

ALiBi (Press, Smith & Lewis 2021, arxiv.org/abs/2108.12409) adds -m_h |i - j| to score (i, j). Queries are
processed in blocks of n; each block attends to its keys in two or three parts, every part one call of
``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` (the kernel behind
``F.scaled_dot_product_attention`` on the CPU), so no (heads, L, L) tensor is ever formed:

1. Keys left of the block. There the bias is m_h (j - b) - m_h (i - b) with b the block's first query. The
   second term is constant along a row, and softmax ignores row constants, so the bias is a *per-key* term
   m_h (j - b): a rank-one update of the scores. Appending m_h / scale to each query and (j - b) to each key
   (one more head-dim column) makes the flash kernel add it tile by tile. The dropped row constant is added
   back to this part's log-sum-exp, exactly. Next to the block, where the softmax mass is, the appended values
   are small, so float32 rounding stays small (a single global base would put m * L ~ 10^4 into every score
   and lose ~1e-3); far keys have large values but weights of order exp(-m * distance).
2. The diagonal block (keys at the block's own positions): the exact (heads, n, n) bias with the causal
   -inf, passed to the kernel as ``attn_mask``. It depends only on i - j, so one mask serves every block.
3. Without a causal mask (encoders), keys right of the block, with the mirrored trick.

The parts are merged with their log-sum-exps, as in flash-attention. Backward calls the kernel's own backward
per part with the merged output and log-sum-exp (so each part sees the global softmax): memory stays O(L) per
head in backward too. Learnable slopes get their gradient from two more appended columns (dq' of the (j - b)
column is sum_j dS_ij (j - b), of a column of ones sum_j dS_ij) and, for the diagonal block, from its
(heads, n, n) score gradient recomputed in plain torch.

Bottom-right causal alignment: with q_len < k_len the queries are the last q_len positions (KV-cache
decoding).
Grouped-query attention: k and v are expanded to q's heads once (O(L) memory).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .blocked_common import check_qkv
from .blocked_common import flash as _flash
from .blocked_common import flash_bwd as _flash_bwd
from .blocked_common import work_dtype as _work_dtype

# Queries per block: as many as keep the diagonal mask (heads x n x n floats) within MASK_ELEMS, up to
# MAX_BLOCK. The masked diagonal call cannot skip its upper triangle, but every block costs ~10 ops, each of
# which can cost a scheduler time slice on a busy machine: larger blocks won (docs/fast-paths.md).
MAX_BLOCK = 1024
MASK_ELEMS = 1 << 23  # 32 MiB of float32


def default_block(heads: int, q_len: int) -> int:
    n = MAX_BLOCK
    while n > 64 and heads * n * n > MASK_ELEMS:
        n //= 2
    return max(1, min(n, q_len))


class _Layout:
    """Padded buffers: q' = [q, m/scale, 0, 0], k' = [k, (j - b), 1, 0], v' = [v, 0] (all head_dim E)."""

    def __init__(self, q, k, v, slopes, scale):
        b, h, lq, d = q.shape
        hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
        self.d, self.dv = d, dv
        self.e = max(d + 2, dv)
        work = _work_dtype(q.dtype)
        self.work = work
        g = h // hk
        # One padded copy each (F.pad is a single op: on a busy machine every extra op is a thread barrier).
        self.qb = F.pad(q.to(work), (0, self.e - d))
        self.qb[..., d] = (slopes.detach().to(work) / scale)[None, :, None]
        k = k.repeat_interleave(g, dim=1) if g > 1 else k
        v = v.repeat_interleave(g, dim=1) if g > 1 else v
        self.kb = F.pad(k.to(work), (0, self.e - d))
        self.kb[..., d + 1] = 1.0
        self.vb = F.pad(v.to(work), (0, self.e - dv))
        self.pos_k = torch.arange(lk, device=q.device, dtype=work)

    def keys(self, j0: int, j1: int, base: int, sign: float) -> torch.Tensor:
        """k' rows [j0, j1) with the appended column sign * (j - base)."""
        kb = self.kb[:, :, j0:j1]
        kb[..., self.d] = (self.pos_k[j0:j1] - base) * sign
        return kb


# The last diagonal mask made, by what it was made from: a short sequence is one diagonal block, so building
# its (heads, n, n) mask twice a step (forward, backward) was a third of a training step's time at L = 512.
# One entry, at most MASK_ELEMS floats; slopes enter by value, so learnable slopes never read a stale mask.
_last_mask: dict = {}


def _diag_mask(slopes, n: int, causal: bool, dtype) -> torch.Tensor:
    """The exact bias of a diagonal block, (1, heads, n, n): -m_h |i - j|, -inf above the diagonal if
    causal. Memoised for the last (slopes, n, causal, dtype)."""
    key = (tuple(slopes.tolist()), n, causal, dtype, slopes.device)
    if key not in _last_mask:
        _last_mask.clear()
        _last_mask[key] = _make_diag_mask(slopes, n, causal, dtype)
    return _last_mask[key]


def _make_diag_mask(slopes, n: int, causal: bool, dtype) -> torch.Tensor:
    rel = torch.arange(n, device=slopes.device, dtype=dtype)
    dist = rel[:, None] - rel[None, :]
    mask = -slopes.to(dtype)[:, None, None] * dist.abs()[None]
    if causal:
        mask = mask.masked_fill((dist < 0)[None], -math.inf)
    return mask[None]


def _blocks(lq: int, lk: int, causal: bool, block: int):
    """Yield (t0, t1, p0, p1, parts): query rows [t0, t1) at absolute positions [p0, p1) and their key parts.

    A part is (j0, j1, base, sign): keys [j0, j1) with appended column sign * (j - base), so that the kernel's
    bias is m * sign * (j - base) and the true one is that plus the row constant -m * sign * (i - base).
    ``sign == 0`` marks the diagonal block, which takes the exact mask instead.
    """
    shift = lk - lq
    for t0 in range(0, lq, block):
        t1 = min(lq, t0 + block)
        p0, p1 = shift + t0, shift + t1
        parts = [(p0, p1, p0, 0.0)]  # the diagonal block
        if p0 > 0:
            parts.append((0, p0, p0, 1.0))  # keys left of the block: bias m (j - p0)
        if not causal and p1 < lk:
            parts.append((p1, lk, p1, -1.0))  # keys right of the block: bias m (p1 - j)
        yield t0, t1, p0, p1, parts


def _row_offset(i_pos, base, sign):
    """sign * (i - base): the row constant divided by -m, (n,)."""
    return sign * (i_pos - base)


class BlockedALiBiAttention(torch.autograd.Function):
    """out = softmax(q k^T * scale - m_h |i - j| (+ causal mask)) v without materialising the bias."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, causal: bool, scale: float, block: int):
        lay = _Layout(q, k, v, slopes, scale)
        b, h, lq, _ = q.shape
        lk = k.shape[2]
        work = lay.work
        sl = slopes.detach().to(work)
        mask = _diag_mask(sl, min(block, lq), causal, work)
        ob = q.new_empty((b, h, lq, lay.e), dtype=work)
        lse = q.new_empty((b, h, lq), dtype=work)
        pos = torch.arange(lk, device=q.device, dtype=work)
        for t0, t1, p0, p1, parts in _blocks(lq, lk, causal, block):
            qb = lay.qb[:, :, t0:t1]
            i_pos = pos[p0:p1]
            n = t1 - t0
            o_all = l_all = None
            for j0, j1, base, sign in parts:
                kp = lay.keys(j0, j1, base, sign)
                if sign == 0.0:
                    o_p, l_p = _flash(qb, kp, lay.vb[:, :, j0:j1], attn_mask=mask[..., :n, :n], scale=scale)
                    l_p = l_p.to(work)
                else:
                    o_p, l_p = _flash(qb, kp, lay.vb[:, :, j0:j1], scale=scale)
                    l_p = l_p.to(work) - sl[:, None] * _row_offset(i_pos, base, sign)[None, :]
                if o_all is None:
                    o_all, l_all = o_p, l_p
                    continue
                # Merge two normalised partial softmaxes: the new part's weight is sigmoid(l_p - l_all).
                o_all = torch.lerp(o_all, o_p, torch.sigmoid(l_p - l_all)[..., None])
                l_all = torch.logaddexp(l_all, l_p)
            ob[:, :, t0:t1] = o_all
            lse[:, :, t0:t1] = l_all
        ctx.save_for_backward(q, k, v, slopes, ob, lse)
        ctx.causal, ctx.scale, ctx.block = causal, scale, block
        return ob[..., : lay.dv].to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, slopes, ob, lse = ctx.saved_tensors
        causal, scale, block = ctx.causal, ctx.scale, ctx.block
        lay = _Layout(q, k, v, slopes, scale)
        b, h, lq, d = q.shape
        hk, lk = k.shape[1], k.shape[2]
        work = lay.work
        sl = slopes.detach().to(work)
        mask = _diag_mask(sl, min(block, lq), causal, work)
        want_slopes = ctx.needs_input_grad[3]
        go = grad_out.new_zeros((b, h, lq, lay.e), dtype=work)
        go[..., : lay.dv] = grad_out
        dq = torch.zeros_like(lay.qb)
        dk = torch.zeros_like(lay.kb)
        dv = torch.zeros_like(lay.vb)
        dslopes = torch.zeros((b, h), dtype=work, device=q.device)
        pos = torch.arange(lk, device=q.device, dtype=work)
        for t0, t1, p0, p1, parts in _blocks(lq, lk, causal, block):
            qb, gob, obb, lb = lay.qb[:, :, t0:t1], go[:, :, t0:t1], ob[:, :, t0:t1], lse[:, :, t0:t1]
            i_pos = pos[p0:p1]
            n = t1 - t0
            for j0, j1, base, sign in parts:
                kp = lay.keys(j0, j1, base, sign)
                vp = lay.vb[:, :, j0:j1]
                if sign == 0.0:
                    dm = mask[..., :n, :n]
                    dqp, dkp, dvp = _flash_bwd(
                        gob, qb, kp, vp, obb, lb.contiguous(), 0.0, False, attn_mask=dm, scale=scale
                    )
                    if want_slopes:  # d score / d m_h = -|i - j| on the diagonal block: recompute its dS
                        s = torch.matmul(qb[..., :d], kp[..., :d].transpose(-1, -2)) * scale + dm
                        p = torch.exp(s - lb[..., None])
                        delta = (gob * obb).sum(-1, keepdim=True)
                        ds = p * (torch.matmul(gob, vp.transpose(-1, -2)) - delta)
                        dslopes -= (ds * (i_pos[:, None] - i_pos[None, :]).abs()).sum((-1, -2))
                else:
                    # The kernel's scores lack the row constant c = -m * rel: pass lse - c, so P =
                    # exp(S_kernel + c - lse).
                    rel = _row_offset(i_pos, base, sign)
                    lp = (lb + sl[:, None] * rel[None, :]).contiguous()
                    dqp, dkp, dvp = _flash_bwd(gob, qb, kp, vp, obb, lp, 0.0, False, scale=scale)
                    # d score_ij / d m_h = sign * (j - base) - rel_i: the appended column's and the ones
                    # column's dq'.
                    dslopes += ((dqp[..., d] - rel * dqp[..., d + 1]) / scale).sum(-1)
                dq[:, :, t0:t1, :d] += dqp[..., :d]
                dk[:, :, j0:j1, :d] += dkp[..., :d]
                dv[:, :, j0:j1] += dvp
        g = h // hk
        dk, dv = dk[..., :d], dv[..., : lay.dv]
        if g > 1:  # fold the expanded heads back onto their kv head
            dk = dk.unflatten(1, (hk, g)).sum(2)
            dv = dv.unflatten(1, (hk, g)).sum(2)
        ds_out = dslopes.sum(0).to(slopes.dtype) if want_slopes else None
        return dq[..., :d].to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), ds_out, None, None, None


def alibi_attention_blocked(
    q, k, v, slopes, *, causal: bool = True, scale: float | None = None, block: int | None = None
):
    """ALiBi attention without a materialised bias. q (B, H, Lq, D); k (B, Hk, Lk, D); v (B, Hk, Lk, Dv);
    slopes (H,).

    Returns (B, H, Lq, Dv) in q's dtype; differentiable in q, k, v and slopes.
    """
    check_qkv(q, k, v, block)
    h = q.shape[1]
    if not isinstance(slopes, torch.Tensor) or slopes.shape != (h,):
        raise ValueError(
            f"slopes must be a tensor of shape ({h},), got "
            f"{tuple(slopes.shape) if isinstance(slopes, torch.Tensor) else type(slopes).__name__}"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    block = default_block(q.shape[1], q.shape[2]) if block is None else block
    return BlockedALiBiAttention.apply(q, k, v, slopes, causal, float(scale), int(block))
