"""One attention entry point that applies any positional scheme.

``attention(q, k, v, rotary=..., bias=...)`` rotates q and k when given a :class:`RotaryEmbedding`,
adds a score bias when given one (an :class:`ALiBi` module or a tensor), and attends with
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import _checks
from .bias import ALiBi
from .rotary import RotaryEmbedding

__all__ = ["attention"]


def _causal_mask(q_len: int, k_len: int, device) -> torch.Tensor:
    """Boolean (q_len, k_len), True where allowed; queries are the last q_len of k_len positions."""
    qi = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] <= qi


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rotary: RotaryEmbedding | None = None,
    bias: ALiBi | torch.Tensor | None = None,
    causal: bool = True,
    positions: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with a positional scheme applied.

    Args:
        q: (batch, heads, q_len, head_dim); k: (batch, kv_heads, k_len, head_dim); v: (batch, kv_heads, k_len, v_dim).
            kv_heads may divide heads (grouped-query attention).
        rotary: rotate q and k at ``positions`` (default 0 .. len-1) before attending.
        bias: an :class:`ALiBi` module, or a float tensor broadcastable to (batch, heads, q_len, k_len).
        causal: a query sees only keys at or before it; when q_len < k_len the queries are the last q_len positions.
        positions: (q_len,) or (batch, q_len) positions for the rotary embedding.
        scale: score scale, default 1/sqrt(head_dim).

    Returns:
        (batch, heads, q_len, v_dim).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _checks.tensor_rank(name, t, 4)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, seq, dim), got {tuple(t.shape)}")
    if k.shape[-2] != v.shape[-2] or k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same heads and length, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q's head count {q.shape[1]} must be a multiple of k's {k.shape[1]}")
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"causal attention needs q_len <= k_len, got {q.shape[-2]} > {k.shape[-2]}")
    if rotary is not None:
        q, k = rotary(q, k, positions=positions)
    elif positions is not None:
        raise ValueError("positions is only used with rotary=; got positions without a rotary embedding")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _checks.positive_float("scale", scale)
    enable_gqa = q.shape[1] != k.shape[1]
    q_len, k_len = q.shape[-2], k.shape[-2]
    if bias is None:
        if causal and q_len != k_len:
            mask = _causal_mask(q_len, k_len, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=enable_gqa)
    if isinstance(bias, ALiBi):
        if bias.n_heads != q.shape[1]:
            raise ValueError(f"ALiBi has n_heads={bias.n_heads}, but q has {q.shape[1]} heads")
        mask = bias.bias(q_len, k_len, causal=causal).to(q.dtype)
    elif isinstance(bias, torch.Tensor):
        mask = bias.to(q.dtype)
        if causal:
            mask = mask.masked_fill(~_causal_mask(q_len, k_len, q.device), -math.inf)
    else:
        raise ValueError(f"bias must be an ALiBi module, a tensor or None, got {type(bias).__name__}")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
