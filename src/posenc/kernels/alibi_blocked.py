"""ALiBi attention in O(L) memory per head on the CPU, forward and backward, on torch's flash kernel.

ALiBi (Press, Smith & Lewis 2021, arxiv.org/abs/2108.12409) adds -m_h |i - j| to score (i, j). Two facts
make it cheap without ever forming a (heads, L, L) tensor:

1. Left of the diagonal (j < i) the bias is m_h (j - b) - m_h (i - b) for any base b. The second term is
   constant along a row, and softmax ignores row constants, so inside a block of queries starting at b
   the bias of every earlier key is a *per-key* term m_h (j - b). A per-key term is a rank-one update of
   the score matrix: append m_h / scale to each query and (j - b) to each key, and one more head-dim
   column lets ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` (the kernel behind
   ``F.scaled_dot_product_attention`` on the CPU) compute the biased scores in cache-sized tiles. The
   dropped row constant is added back to that part's log-sum-exp, exactly, in float32. The base moves with
   the block, so the appended values stay small next to the diagonal, where the softmax mass is (a single
   global base would put values of m * L ~ 10^4 into every score and lose ~1e-3 to rounding).
   Right of the diagonal (non-causal encoders) the same holds with the sign flipped.
2. The diagonal block (queries i in [b, b + n), keys in the same range) is square, so with a causal mask
   its top-left alignment (the flash kernel's) equals the bottom-right one: it is one more flash call,
   with the same per-key trick and the base in the middle of the block, so appended values stay within
   m * n / 2 (n = 128: at most 32, rounding ~2e-6). Without a causal mask (encoders) |i - j| is not linear
   inside the block; there the n x n block is computed exactly in plain torch.

The parts are merged with their log-sum-exps, as in flash-attention. Backward recomputes block by block with
the flash kernel's own backward, given the merged output and log-sum-exp (so each part sees the global
softmax), so memory stays O(L) per head in backward too. Learnable slopes get their gradient from two more
appended columns: dq' of the (j - b) column is sum_j dS_ij (j - b), and of a column of ones is sum_j dS_ij.

Bottom-right causal alignment: with q_len < k_len the queries are the last q_len positions (KV-cache decoding).
Grouped-query attention: k and v are expanded to q's heads once (O(L) memory).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

# Queries per block. Larger blocks mean fewer flash calls (each has a fixed cost and, on a busy machine, a
# thread barrier), but the diagonal block's appended values grow as m * n / 2 and lose precision; 128
# keeps float32 rounding of the scores near the diagonal at ~2e-6.
BLOCK = 128


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    # The appended (j - b) column must be exact: bfloat16/float16 cannot hold integers past 256 / 2048.
    return torch.float64 if dtype == torch.float64 else torch.float32


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


def _diag_scores(qb, kb, slopes, i_pos, j_pos, causal, scale, d):
    """Exact biased scores (b, h, n, n) of a diagonal block, in the work dtype."""
    s = torch.matmul(qb[..., :d], kb[..., :d].transpose(-1, -2)) * scale
    dist = i_pos[:, None] - j_pos[None, :]
    s = s - slopes.to(s.dtype)[None, :, None, None] * dist.abs()[None, None]
    if causal:
        s = s.masked_fill((dist < 0)[None, None], -math.inf)
    return s


def _blocks(lq: int, lk: int, causal: bool, block: int):
    """Yield (t0, t1, p0, p1, parts): query rows [t0, t1) at absolute positions [p0, p1) and their key parts.

    A part is (j0, j1, base, sign, is_causal): keys [j0, j1) with appended column sign * (j - base), so that
    the kernel's bias is m * sign * (j - base) and the true one is that plus the row constant
    -m * sign * (i - base). With causal=False the diagonal block is left to the exact plain-torch path.
    """
    shift = lk - lq
    for t0 in range(0, lq, block):
        t1 = min(lq, t0 + block)
        p0, p1 = shift + t0, shift + t1
        parts = []
        if p0 > 0:
            parts.append((0, p0, p0, 1.0, False))  # keys left of the block: bias m (j - p0)
        if causal:
            parts.append((p0, p1, (p0 + p1 - 1) // 2, 1.0, True))  # the diagonal block, base at its middle
        elif p1 < lk:
            parts.append((p1, lk, p1, -1.0, False))  # keys right of the block: bias m (p1 - j)
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
        ob = q.new_empty((b, h, lq, lay.e), dtype=work)
        lse = q.new_empty((b, h, lq), dtype=work)
        pos = torch.arange(lk, device=q.device, dtype=work)
        for t0, t1, p0, p1, parts in _blocks(lq, lk, causal, block):
            qb = lay.qb[:, :, t0:t1]
            i_pos = pos[p0:p1]
            o_all = l_all = None
            if not causal:  # diagonal block of an encoder: exact, in plain torch
                s = _diag_scores(qb, lay.kb[:, :, p0:p1], sl, i_pos, i_pos, causal, scale, lay.d)
                l_all = torch.logsumexp(s, dim=-1)
                o_all = torch.matmul(torch.exp(s - l_all[..., None]), lay.vb[:, :, p0:p1])
            for j0, j1, base, sign, part_causal in parts:
                kp = lay.keys(j0, j1, base, sign)
                o_p, l_p = _flash(qb, kp, lay.vb[:, :, j0:j1], is_causal=part_causal, scale=scale)
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
            if not causal:  # diagonal block of an encoder, exact
                delta = (gob * obb).sum(-1, keepdim=True)  # rowsum(dO * O), the softmax-backward term
                kd, vd = lay.kb[:, :, p0:p1], lay.vb[:, :, p0:p1]
                s = _diag_scores(qb, kd, sl, i_pos, i_pos, causal, scale, d)
                p = torch.exp(s - lb[..., None])
                ds = p * (torch.matmul(gob, vd.transpose(-1, -2)) - delta)
                dq[:, :, t0:t1, :d] += torch.matmul(ds, kd[..., :d]) * scale
                dk[:, :, p0:p1, :d] += torch.matmul(ds.transpose(-1, -2), qb[..., :d]) * scale
                dv[:, :, p0:p1] += torch.matmul(p.transpose(-1, -2), gob)
                dslopes -= (ds * (i_pos[:, None] - i_pos[None, :]).abs()).sum((-1, -2))
            for j0, j1, base, sign, part_causal in parts:
                # The kernel's scores lack the row constant c = -m * rel, so pass lse - c: P = exp(S_kernel + c - lse).
                rel = _row_offset(i_pos, base, sign)
                lp = (lb + sl[:, None] * rel[None, :]).contiguous()
                kp = lay.keys(j0, j1, base, sign)
                dqp, dkp, dvp = _flash_bwd(gob, qb, kp, lay.vb[:, :, j0:j1], obb, lp, 0.0, part_causal, scale=scale)
                dq[:, :, t0:t1, :d] += dqp[..., :d]
                dk[:, :, j0:j1, :d] += dkp[..., :d]
                dv[:, :, j0:j1] += dvp
                # d score_ij / d m_h = sign * (j - base) - rel_i: the appended column's and the ones column's dq'.
                dslopes += ((dqp[..., d] - rel * dqp[..., d + 1]) / scale).sum(-1)
        g = h // hk
        dk, dv = dk[..., :d], dv[..., : lay.dv]
        if g > 1:  # fold the expanded heads back onto their kv head
            dk = dk.unflatten(1, (hk, g)).sum(2)
            dv = dv.unflatten(1, (hk, g)).sum(2)
        ds_out = dslopes.sum(0).to(slopes.dtype) if ctx.needs_input_grad[3] else None
        return dq[..., :d].to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), ds_out, None, None, None


def alibi_attention_blocked(q, k, v, slopes, *, causal: bool = True, scale: float | None = None, block: int = BLOCK):
    """ALiBi attention without a materialised bias. q (B, H, Lq, D); k (B, Hk, Lk, D); v (B, Hk, Lk, Dv); slopes (H,).

    Returns (B, H, Lq, Dv) in q's dtype; differentiable in q, k, v and slopes.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return BlockedALiBiAttention.apply(q, k, v, slopes, causal, float(scale), int(block))
