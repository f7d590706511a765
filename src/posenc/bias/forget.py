"""Forgetting Attention, the attention of the Forgetting Transformer, FoX (Lin, Nikishin, He & Courville 2025,
"Forgetting Transformer: Softmax Attention with a Forget Gate", ICLR 2025, arxiv.org/abs/2503.02130).

Per head, a scalar forget gate f_t = sigmoid(w^T x_t + b) from the layer's input hidden state x_t (the
normalised hidden state that q, k and v are projected from); query i and key j <= i get the data-dependent
decay bias

    D_ij = sum_{l = j+1 .. i} log f_l = c_i - c_j,   c_t = sum_{l <= t} log f_l,
    out_i = sum_j softmax_j(q_i . k_j * scale + D_ij) v_j   (causal; D_ii = 0).

This is the paper's plain FoX ("LLaMA" block, the authors' ``fgate_type="full"``): no positional encoding
otherwise, none of the "Pro" block's extras (output gate, output norm, QK-norm, key/value shift), no
pruning. :class:`ForgetGate` is the gate as the authors' code builds it (zhixuan-lin/forgetting-transformer,
``ForgettingAttentionLayer``): ``nn.Linear(d_model, heads)`` with a bias, weights N(0, 0.02^2) and bias 0
(so f starts near 1/2), log f = logsigmoid of the logit in float32.

A :class:`ForgetGate` maps the hidden state to a :class:`ForgetBias`, the call's gates as a content bias:
``posenc.attention(q, k, v, bias=gate(x))``. :func:`forgetting_attention` takes the log-gates of every key
position, so one call serves training (q_len == k_len) and decoding with a KV cache (the queries are the last
q_len positions; the cache keeps the gates of its keys: :meth:`ForgetBias.after`). It runs on
:mod:`posenc.kernels.query_blocked`: blocks of queries against the keys they see,
each a materialised (n, keys) block recomputed in the backward, so memory is O(L) per head and the
gradients (q, k, v and the gates) are autograd's, exact.

Precision: c grows like L |log f| (10^5 at L = 4096 with log f = -30), so c_i - c_j taken as a difference of
two float32 cumulative sums would lose up to ~1e-2 in every score. c is summed in float64 and each block takes
its differences c_i - c_j in float64 before rounding them once to the work dtype, so every bias is exact to
float32 rounding of its own value. (The rank-one trick of ALiBi's kernel, a per-key column appended to k, is
not used: a column rebased to one position per block carries values of up to block x |log f| into the
scores of the rows far from that position; simulated at log f = -1 with 512-query blocks it was 2.6e-5 off
the float64 reference, where this path is 5e-7.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import _checks
from ..kernels.blocked_common import check_qkv
from ..kernels.query_blocked import query_blocked_attention
from .content import ContentBias

__all__ = ["ForgetBias", "ForgetGate", "forgetting_attention"]

# Temporaries per score of a block (scores, the float64 bias counts twice, the masked sum, softmax, and
# the backward's gradients of each), which sizes the blocks (query_blocked.default_block).
_WIDTH = 12


class ForgetGate(nn.Module):
    """FoX's forget gate for one layer: log f = logsigmoid(x W^T + b), one scalar gate per head and token.

    Args:
        d_model: the hidden state's width.
        n_heads: heads of the layer (one gate each; with grouped-query attention, one per query head).

    forward(x (batch, seq, d_model)) -> a :class:`ForgetBias` holding log f (batch, n_heads, seq), float32
    (float64 for float64 input), every entry <= 0: ``posenc.attention(q, k, v, bias=gate(x))``;
    :meth:`log_gates` gives the tensor itself.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.d_model = _checks.positive_int("d_model", d_model, size=True)
        self.n_heads = _checks.positive_int("n_heads", n_heads, size=True)
        self.proj = nn.Linear(self.d_model, self.n_heads, bias=True)
        # the authors' initialisation: N(0, 0.02^2) weights and a zero bias, so every gate starts near 1/2
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}"

    def log_gates(self, x: torch.Tensor) -> torch.Tensor:
        """log f (batch, n_heads, seq) of x (batch, seq, d_model)."""
        _checks.tensor_rank("x", x, 3)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq, {self.d_model}), got {tuple(x.shape)}")
        logits = self.proj(x)
        # in float32 as the authors do: half-precision log-gates would round the decay of long spans
        work = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return F.logsigmoid(logits.to(work)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> ForgetBias:
        return ForgetBias(self.log_gates(x))


class ForgetBias(ContentBias):
    """FoX's decay bias for one call, as :func:`posenc.attention`'s ``bias=``: query i and key j <= i get
    sum_{l=j+1..i} log f_l, causal only (the decay runs from a key to later queries).

    Args:
        log_forget: (batch, heads, k_len) log f of every key position, <= 0 and finite (a
            :class:`ForgetGate`'s :meth:`~ForgetGate.log_gates`), checked against q at the call;
            differentiable. With a KV cache, the cached keys' gates followed by the new ones
            (:meth:`after`).
    """

    causal_only = True

    def __init__(self, log_forget: torch.Tensor):
        super().__init__()
        self.log_forget = log_forget

    def after(self, cached: ForgetBias | None) -> ForgetBias:
        """The bias of a decoding call: ``cached``'s gates (the KV cache's keys) followed by these."""
        if cached is None:
            return self
        return ForgetBias(torch.cat((cached.log_forget, self.log_forget), dim=-1))

    def attend(self, q, k, v, *, causal: bool = True, scale: float | None = None, block: int | None = None):
        """:func:`forgetting_attention` with these gates; refuses ``causal=False``."""
        if causal is not True:
            raise ValueError(
                f"ForgetBias works with causal attention only (the decay runs from a key to later queries), "
                f"got causal={causal!r}"
            )
        return forgetting_attention(q, k, v, self.log_forget, scale=scale, block=block)


def _check_gates(log_forget, q: torch.Tensor, k_len: int) -> None:
    want = (q.shape[0], q.shape[1], k_len)
    if not isinstance(log_forget, torch.Tensor) or not log_forget.is_floating_point():
        raise ValueError(
            f"log_forget must be a float tensor of shape (batch, heads, k_len) = {want}, got "
            f"{type(log_forget).__name__ if not isinstance(log_forget, torch.Tensor) else log_forget.dtype}"
        )
    if tuple(log_forget.shape) != want:
        raise ValueError(
            f"log_forget must have shape (batch, heads, k_len) = {want} (one log-gate per query head and "
            f"key position), got {tuple(log_forget.shape)}"
        )
    if _checks.can_read(log_forget) and log_forget.numel():
        if not bool(torch.isfinite(log_forget).all()):
            bad = log_forget[~torch.isfinite(log_forget)][0].item()
            raise ValueError(f"log_forget must be finite (the log of a gate in (0, 1]), got {bad}")
        top = log_forget.max().item()
        if top > 0:
            raise ValueError(f"log_forget must be <= 0 (the log of a gate in (0, 1]), got {top}")


def _block(q, k, v, q_pos, k_pos, causal: bool, scale: float, c) -> torch.Tensor:
    """One block of queries (B, Hk, G, n, D) at q_pos against keys (B, Hk, nk, D) at k_pos; c (B, H, L)
    float64 cumulative log-gates. Returns (B, Hk, G, n, Dv)."""
    lead = q.shape[:4]
    c = c.unflatten(1, lead[1:3])  # (B, Hk, G, L): query head h reads kv head h // G
    # differences in float64, rounded once: exact whatever the magnitude of c (module docstring)
    bias = (c[..., q_pos, None] - c[..., None, k_pos]).to(q.dtype)
    logits = ((q * scale).flatten(2, 3) @ k.transpose(-1, -2)).unflatten(2, lead[2:])
    future = k_pos[None, :] > q_pos[:, None]
    # key i itself has bias 0 and is never masked, so no row is all -inf and no softmax gives NaN
    p = torch.softmax((logits + bias).masked_fill(future, -math.inf), dim=-1)
    return (p.flatten(2, 3) @ v).unflatten(2, lead[2:])


def forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_forget: torch.Tensor,
    *,
    scale: float | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Causal softmax attention with FoX's decay bias D_ij = c_i - c_j (module docstring).

    Args:
        q: (batch, heads, q_len, head_dim); k: (batch, kv_heads, k_len, head_dim); v: (batch, kv_heads,
            k_len, v_dim); kv_heads divides heads (grouped-query attention). Queries are the last q_len of
            the k_len positions (decoding with a KV cache).
        log_forget: (batch, heads, k_len) log f_t of every key position, <= 0 and finite (a
            :class:`ForgetGate`'s output); differentiable.
        scale: score scale, default 1/sqrt(head_dim).
        block: queries per block (default: sized by :func:`posenc.kernels.query_blocked.default_block`).

    Returns:
        (batch, heads, q_len, v_dim) in q's dtype. Computed in float32 (float64 for float64 q).
    """
    check_qkv(q, k, v, block)
    _check_gates(log_forget, q, k.shape[2])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _checks.positive_float("scale", scale)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    c = log_forget.to(torch.float64).cumsum(-1)  # O(L) in float64: see the module docstring
    out = query_blocked_attention(
        _block, q.to(work), k.to(work), v.to(work), (c,), causal=True, scale=scale, width=_WIDTH, block=block
    )
    return out.to(q.dtype)
