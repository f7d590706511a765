"""Attention with any :class:`~posenc.bias.base.ScoreBias` in O(L) memory per head on the CPU, forward and
backward, on torch's flash kernel.

Queries go in blocks of n; each block is one call of
``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` over the keys it may see, with the block's
(heads, n, keys) bias as ``attn_mask``:

* a **table** bias (a function of i - j) is a Toeplitz matrix, which is a zero-copy ``as_strided`` view of the
  one (heads, 2 L - 1) distance table once the keys are taken in *reverse* order (then entry (a, j') is
  table[offset + a + j']: both strides +1). k and v are flipped once (O(L)); no (heads, n, L) tensor exists.
  With a causal mask the table holds -inf at negative distances, so the view is the causal mask too.
* a **tile** bias (FIRE) computes its (heads, n, keys) block; blocks are sized so it stays small.

The kernel returns each block's log-sum-exp; backward calls the kernel's own backward per block with the saved
output and log-sum-exp. Learnable biases need each block's score gradient dS = P * (dO V^T - rowsum(dO * O)),
which the kernel does not return: for them the whole block backward runs in plain torch from P (recomputed
from the saved log-sum-exp) and dS, five matmuls as in the kernel. Each block's bias, and what its dS adds
to the bias's gradients, come from the bias's block walker (:mod:`.block_walkers`, the one hook:
``bias.block_walker``): for a table, table entry t collects the sum of dS along its (anti-)diagonal (a
pad-and-reshape "skew", no index tensor); for a tile, autograd of the recomputed tile against dS, or the
bias's own walker (FIRE's, :mod:`.fire_walker`, computes its parameters' gradients from dS by hand).

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

MAX_BLOCK = 512
# Backward with learnable biases and tile biases hold a few (batch, heads, n, keys) temporaries per block;
# n is capped so that together they stay within TEMP_ELEMS floats (32 MiB of float32). Larger blocks mean
# fewer ops (docs/relative-biases.md has the measurement). A table bias's backward holds only P and dS per
# score, so it takes a larger budget: at long L the smaller one left it a few queries per block, whose
# small matmuls set its time (docs/fast-paths.md).
TEMP_ELEMS = 1 << 23
TABLE_BACKWARD_ELEMS = 1 << 25
# A tile bias computes its blocks (bias.tile_width floats per query-key pair, all heads together) forward
# and again backward; its blocks get the largest budget, as fewer, larger blocks were measured faster
# (docs/fast-paths.md).
TILE_ELEMS = 1 << 26


def _pow2_floor(x: int) -> int:
    return 1 << max(0, int(x).bit_length() - 1)


def default_block(
    batch: int, heads: int, q_len: int, k_len: int, width: int, temporaries: bool, budget: int = TEMP_ELEMS
) -> int:
    """Queries per block: MAX_BLOCK, or fewer so that ``width`` temporaries of (batch, heads, n, k_len) stay
    within ``budget`` elements."""
    n = MAX_BLOCK
    if temporaries:
        n = min(n, max(16, _pow2_floor(budget // max(1, batch * heads * k_len * width))))
    return max(1, min(n, q_len))


def _blocks(lq: int, lk: int, causal: bool, block: int):
    """(t0, t1, p0, kend): query rows [t0, t1) at positions p0.. and the keys [0, kend) they see."""
    shift = lk - lq
    for t0 in range(0, lq, block):
        t1 = min(lq, t0 + block)
        yield t0, t1, shift + t0, (shift + t1) if causal else lk


def _prepare(q, k, v, work):
    """q, reversed k and v in the work dtype, padded to one head dim e (the kernel needs equal q/k/v dims)."""
    d, dv, g = q.shape[-1], v.shape[-1], q.shape[1] // k.shape[1]
    e = max(d, dv)
    k = k.repeat_interleave(g, dim=1) if g > 1 else k
    v = v.repeat_interleave(g, dim=1) if g > 1 else v
    qw = F.pad(q.to(work), (0, e - d))
    kr = F.pad(k.to(work).flip(2), (0, e - d))
    vr = F.pad(v.to(work).flip(2), (0, e - dv))
    return qw, kr, vr


class BlockedBiasAttention(torch.autograd.Function):
    """out = softmax(q k^T * scale + b_h(i, j) (+ causal mask)) v, block by block (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, causal: bool, scale: float, blocks: tuple, *inputs):
        b, h, lq, d = q.shape
        lk, dv = k.shape[2], v.shape[-1]
        work = _work_dtype(q.dtype)
        qw, kr, vr = _prepare(q, k, v, work)
        walker = bias.block_walker(inputs, lk, causal, work)
        out = qw.new_empty((b, h, lq, qw.shape[-1]))
        lse = qw.new_empty((b, h, lq))
        for t0, t1, p0, kend in _blocks(lq, lk, causal, blocks[0]):
            o, l_ = _flash(
                qw[:, :, t0:t1],
                kr[:, :, lk - kend :],
                vr[:, :, lk - kend :],
                attn_mask=walker.mask(p0, t1 - t0, kend),
                scale=scale,
            )
            out[:, :, t0:t1] = o
            lse[:, :, t0:t1] = l_
        ctx.save_for_backward(qw, kr, vr, out, lse, *inputs)
        ctx.bias, ctx.causal, ctx.scale, ctx.blocks = bias, causal, scale, blocks
        ctx.dims = (d, dv, k.shape[1], q.dtype, k.dtype, v.dtype)
        return out[..., :dv].to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        qw, kr, vr, out, lse, *inputs = ctx.saved_tensors
        d, dv, hk, q_dtype, k_dtype, v_dtype = ctx.dims
        b, h, lq, e = qw.shape
        lk, work = kr.shape[2], qw.dtype
        walker = ctx.bias.block_walker(inputs, lk, ctx.causal, work)
        want = any(ctx.needs_input_grad[7:])
        go = F.pad(grad_out.to(work), (0, e - dv))
        dq, dkr, dvr = torch.zeros_like(qw), torch.zeros_like(kr), torch.zeros_like(vr)
        grads = walker.new_grads() if want else None
        for t0, t1, p0, kend in _blocks(lq, lk, ctx.causal, ctx.blocks[1] if want else ctx.blocks[0]):
            mask = walker.mask(p0, t1 - t0, kend)
            qb, gob, ob, lb = (
                qw[:, :, t0:t1],
                go[:, :, t0:t1],
                out[:, :, t0:t1],
                lse[:, :, t0:t1].contiguous(),
            )
            kb, vb = kr[:, :, lk - kend :], vr[:, :, lk - kend :]
            if want:  # the bias needs dS, so the whole block's backward is done here, from P and dS
                dqp, dkp, dvp, ds = _backward_with_ds(qb, kb, vb, gob, ob, lb, mask, ctx.scale)
                walker.accumulate(grads, p0, t1 - t0, kend, ds.sum(0))
            else:
                dqp, dkp, dvp = _flash_bwd(
                    gob, qb, kb, vb, ob, lb, 0.0, False, attn_mask=mask, scale=ctx.scale
                )
            dq[:, :, t0:t1] = dqp
            dkr[:, :, lk - kend :] += dkp
            dvr[:, :, lk - kend :] += dvp
        dk, dv_ = dkr.flip(2)[..., :d], dvr.flip(2)[..., :dv]
        if h != hk:  # fold the expanded heads back onto their kv head
            dk = dk.unflatten(1, (hk, h // hk)).sum(2)
            dv_ = dv_.unflatten(1, (hk, h // hk)).sum(2)
        input_grads = (
            [g.to(x.dtype) for g, x in zip(walker.finish(grads), inputs, strict=True)]
            if want
            else [None] * len(inputs)
        )
        return dq[..., :d].to(q_dtype), dk.to(k_dtype), dv_.to(v_dtype), None, None, None, None, *input_grads


def _backward_with_ds(qb, kb, vb, gob, ob, lb, mask, scale: float):
    """One block's backward in plain torch, returning its score gradient too: (dq, dk, dv, dS).

    P = exp(S - lse) from the saved log-sum-exp, dS = P * (dO V^T - rowsum(dO * O)), then dq = dS K scale,
    dk = dS^T Q scale, dv = P^T dO: five matmuls, as many as the flash kernel's backward, which cannot hand
    dS out (calling it as well and recomputing P and dO V^T beside it cost two more and most of the time).
    """
    p = torch.matmul(qb, kb.transpose(-1, -2)).mul_(scale).add_(mask).sub_(lb[..., None]).exp_()
    delta = (gob * ob).sum(-1, keepdim=True)
    ds = torch.matmul(gob, vb.transpose(-1, -2)).sub_(delta).mul_(p)
    dq = torch.matmul(ds, kb).mul_(scale)
    dk = torch.matmul(ds.transpose(-1, -2), qb).mul_(scale)
    dv = torch.matmul(p.transpose(-1, -2), gob)
    return dq, dk, dv, ds


def _check(q, k, v, bias, block) -> None:
    check_qkv(q, k, v, block)
    h = q.shape[1]
    if getattr(bias, "n_heads", None) != h or not callable(getattr(bias, "block_walker", None)):
        raise ValueError(
            f"bias must be a posenc ScoreBias with n_heads={h} (q's heads), got {type(bias).__name__} with "
            f"n_heads={getattr(bias, 'n_heads', None)}"
        )


def bias_attention_blocked(q, k, v, bias, *, causal: bool = True, scale: float | None = None, block=None):
    """Attention with a score bias without materialising it. q (B, H, Lq, D); k (B, Hk, Lk, D);
    v (B, Hk, Lk, Dv); ``bias`` a :class:`~posenc.bias.base.ScoreBias` with H heads.

    Returns (B, H, Lq, Dv) in q's dtype; differentiable in q, k, v and the bias's parameters. ``block``
    (queries per block) defaults to :func:`default_block`.
    """
    _check(q, k, v, bias, block)
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    inputs = bias.walker_inputs(lk, bool(causal), q.device)
    if block is None and bias.per_tile:  # its tiles are per query-key pair, P and dS per head and batch row
        width = bias.tile_width
        blocks = (
            default_block(1, 1, lq, lk, width, True, TILE_ELEMS),
            default_block(1, 1, lq, lk, 4 * b * h + width, True, TILE_ELEMS),
        )
    elif block is None:
        blocks = (
            default_block(1, 1, lq, lk, 0, False),
            default_block(b, h, lq, lk, 4, True, TABLE_BACKWARD_ELEMS),
        )
    else:
        blocks = (block, block)
    return BlockedBiasAttention.apply(q, k, v, bias, bool(causal), scale, blocks, *inputs)
