"""Attention whose position term depends on the query content (Shaw et al. 2018, CoPE), in O(L) memory per
head, forward and backward, with exact gradients.

A scheme gives one function, ``fn(q, k, v, q_pos, k_pos, causal, scale, *params) -> out``, that computes the
materialised attention of a block of queries against the keys they may see:

* q (batch, kv_heads, group, n, head_dim): the block's queries, grouped under their kv head (grouped-query
  attention: query head h reads kv head h // group, as ``scaled_dot_product_attention(enable_gqa=True)``);
* k (batch, kv_heads, nk, head_dim), v (batch, kv_heads, nk, v_dim): the keys, never expanded to q's heads;
* q_pos (n,), k_pos (nk,): integer positions (queries are the last q_len of the k_len positions);
* returns (batch, kv_heads, group, n, v_dim).

Queries go in blocks of n rows (:class:`QueryBlockedAttention`, a hand-made checkpoint): the forward runs
each block without a graph into one output buffer and saves only q, k, v and the parameters; the backward
recomputes one block under autograd, takes its gradients and drops it before the next, so at most one
block's (heads, n, keys) temporaries live. With ``causal`` a block sees only the keys up to its last query.
Blocks run longest first: each fits in the memory the previous one freed. (``torch.utils.checkpoint`` per
block gave the same gradients, but each block's small output, allocated between the temporaries, pinned the
heap: a CoPE forward at L = 4096 raised the peak RSS by 410 MiB instead of 18.) Tiny inputs
(``MATERIALISE_MAX`` scores or fewer) take one block with plain autograd.

Under ``torch.compile`` the blocked path is not traced (:func:`torch.compiler.disable`: one graph break per
call; tracing would unroll the block loop); the one-block path is.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .blocked_common import check_qkv

__all__ = ["MATERIALISE_MAX", "MAX_BLOCK", "TEMP_ELEMS", "default_block", "query_blocked_attention"]

MAX_BLOCK = 256
# A block holds about ``width`` (batch, heads, n, keys) temporaries while backward recomputes it; n is capped
# so that they stay within TEMP_ELEMS floats (64 MiB of float32) whatever L.
TEMP_ELEMS = 1 << 24
# At and below this many scores (batch * heads * q_len * k_len), one materialised block without a checkpoint.
MATERIALISE_MAX = 1 << 18


def _pow2_floor(x: int) -> int:
    return 1 << max(0, int(x).bit_length() - 1)


def default_block(batch: int, heads: int, q_len: int, k_len: int, width: int) -> int:
    """Queries per block: all of them when tiny, else MAX_BLOCK or fewer (at least 16) so that ``width``
    temporaries of (batch, heads, n, k_len) stay within TEMP_ELEMS."""
    if batch * heads * q_len * k_len <= MATERIALISE_MAX:
        return max(1, q_len)
    n = min(MAX_BLOCK, max(16, _pow2_floor(TEMP_ELEMS // max(1, batch * heads * k_len * width))))
    return max(1, min(n, q_len))


def _blocks(lq: int, lk: int, causal: bool, block: int):
    """(t0, t1, kend): query rows [t0, t1) and the keys [0, kend) they see, the longest first (so that each
    block's temporaries fit in the memory the previous block freed)."""
    shift = lk - lq
    for t0 in reversed(range(0, lq, block)):
        t1 = min(lq, t0 + block)
        yield t0, t1, (shift + t1) if causal else lk


class QueryBlockedAttention(torch.autograd.Function):
    """``fn`` block by block: forward without a graph into one output buffer; backward recomputes each block
    under autograd and takes its gradients before the next (module docstring)."""

    @staticmethod
    def forward(ctx, fn, causal: bool, scale: float, block: int, q, k, v, *params):
        b, h, lq, _ = q.shape
        hk, lk = k.shape[1], k.shape[2]
        qg, pos = q.unflatten(1, (hk, h // hk)), torch.arange(lk, device=q.device)
        out = q.new_empty(b, hk, h // hk, lq, v.shape[-1])
        for t0, t1, kend in _blocks(lq, lk, causal, block):
            q_pos = pos[lk - lq + t0 : lk - lq + t1]
            out[:, :, :, t0:t1] = fn(
                qg[:, :, :, t0:t1], k[:, :, :kend], v[:, :, :kend], q_pos, pos[:kend], causal, scale, *params
            )
        ctx.save_for_backward(q, k, v, *params)
        ctx.fn, ctx.causal, ctx.scale, ctx.block = fn, causal, scale, block
        return out.flatten(1, 2)

    @staticmethod
    @once_differentiable  # the blocks' gradients are taken on detached inputs: no double backward
    def backward(ctx, grad_out):
        q, k, v, *params = ctx.saved_tensors
        b, h, lq, _ = q.shape
        hk, lk = k.shape[1], k.shape[2]
        want = ctx.needs_input_grad[4:]
        qg, pos = q.detach().unflatten(1, (hk, h // hk)), torch.arange(lk, device=q.device)
        go = grad_out.unflatten(1, (hk, h // hk))
        dq, dk, dv = (torch.zeros_like(t) if w else None for t, w in zip((qg, k, v), want, strict=False))
        dparams = [torch.zeros_like(p) if w else None for p, w in zip(params, want[3:], strict=True)]
        detached = [p.detach().requires_grad_(w) for p, w in zip(params, want[3:], strict=True)]
        for t0, t1, kend in _blocks(lq, lk, ctx.causal, ctx.block):
            inputs = [qg[:, :, :, t0:t1], k.detach()[:, :, :kend], v.detach()[:, :, :kend]]
            inputs = [x.requires_grad_(w) for x, w in zip(inputs, want, strict=False)]
            q_pos = pos[lk - lq + t0 : lk - lq + t1]
            with torch.enable_grad():
                o = ctx.fn(*inputs, q_pos, pos[:kend], ctx.causal, ctx.scale, *detached)
                wrt = [x for x, w in zip([*inputs, *detached], want, strict=True) if w]
                grads = iter(torch.autograd.grad(o, wrt, go[:, :, :, t0:t1], allow_unused=True))
            for i, w in enumerate(want):
                g = next(grads) if w else None
                if g is None:
                    continue
                if i == 0:
                    dq[:, :, :, t0:t1] = g
                elif i == 1:
                    dk[:, :, :kend] += g
                elif i == 2:
                    dv[:, :, :kend] += g
                else:
                    dparams[i - 3] += g
        dq = None if dq is None else dq.flatten(1, 2)
        return None, None, None, None, dq, dk, dv, *dparams


def _run(fn, q, k, v, params, causal: bool, scale: float, block: int) -> torch.Tensor:
    h, lq = q.shape[1], q.shape[2]
    hk, lk = k.shape[1], k.shape[2]
    if block >= lq:  # one materialised block: plain autograd, which torch.compile traces
        pos = torch.arange(lk, device=q.device)
        return fn(q.unflatten(1, (hk, h // hk)), k, v, pos[lk - lq :], pos, causal, scale, *params).flatten(
            1, 2
        )
    return QueryBlockedAttention.apply(fn, causal, scale, block, q, k, v, *params)


_run_eager = None  # torch.compiler.disable(_run), made on first use: building it imports dynamo (~2.5 s)


def _eager():
    global _run_eager
    if _run_eager is None:
        _run_eager = torch.compiler.disable(_run)
    return _run_eager


def query_blocked_attention(
    fn, q, k, v, params=(), *, causal: bool, scale: float, width: int = 8, block: int | None = None
) -> torch.Tensor:
    """Attention block by block of queries (module docstring). q (B, H, Lq, D); k (B, Hk, Lk, D);
    v (B, Hk, Lk, Dv); ``params``: tensors ``fn`` takes after its positional arguments (their gradients
    flow); ``width``: ``fn``'s temporaries per score, for :func:`default_block`; ``block``: queries per
    block (default :func:`default_block`). Returns (B, H, Lq, Dv)."""
    check_qkv(q, k, v, block)
    b, h, lq, _ = q.shape
    if lq == 0:  # nothing to attend from (and a block's bias would index an empty key range)
        return q.new_empty(b, h, 0, v.shape[-1])
    if block is None:
        block = default_block(b, h, lq, k.shape[2], width)
    if block >= lq and torch.compiler.is_compiling():
        return _run(fn, q, k, v, tuple(params), bool(causal), float(scale), block)  # one block traces
    return _eager()(fn, q, k, v, tuple(params), bool(causal), float(scale), block)
