"""A hidden-state-conditioned banded relative bias: the RoPE-free attention of Inkling (Thinking Machines Lab,
2026, thinkingmachines.ai/news/introducing-inkling; served by vLLM and SGLang, with a llama.cpp port under
review, and in Hugging Face transformers as ``InklingRelativeLogits``).

Per layer, a learned table P (d_rel, extent) of bias-versus-distance profiles, shared by the heads, and per
head and token a small projection of the layer's normalised hidden state, r_i = W_h x_i (d_rel numbers). Query
i and key j get

    b_ij = r_i . P[:, i - j]   for 0 <= i - j < extent,   0 beyond the extent,
    out_i = sum_{j <= i} softmax_j(q_i . k_j * scale + b_ij) v_j   (causal),

so each token mixes the d_rel profiles into its own bias over the last ``extent`` keys, and keys farther away
are attended by content alone. Inkling has no other position encoding; its log-length temperature
tau(n) = 1 + alpha log(max(n / n_floor, 1)) (n the keys a query sees) multiplies the whole score row, q_i and
r_i alike; a caller applies it to q and r before :func:`banded_attention` (the laboratory's ``banded`` scheme
does, through its query scale).

:class:`BandedRelative` holds W (``proj``, ``nn.Linear(d_model, heads * d_rel, bias=False)``) and P
(``table``), both started N(0, 0.02^2) as the Hugging Face port initialises them, and maps hidden states to a
:class:`BandedBias`, r (batch, heads, seq, d_rel) with P as one call's content bias:
``posenc.attention(q, k, v, bias=rel(x))``; :func:`banded_attention` attends with r and P. r belongs to
the queries only: with a KV cache, pass the new queries' r (the queries are the last q_len of the k_len
positions); the cache keeps nothing for it.

How it runs: on :mod:`posenc.kernels.query_blocked`, like FoX, Shaw and CoPE. A block of n queries takes its
rows of r, computes R P[:, :m] -> (n, m) profiles per head (one matmul; m = min(extent, keys of the block):
no distance in a block reaches past its keys), and adds them into the block's (n, keys) scores along the
band with one ``scatter_add`` over (n, m) indices (key i - d of distance d); the backward recomputes one
block at a time under autograd, so the gradients of q, k, v, r and P are exact. Memory is one block's
(n, keys) scores and (n, m) profiles: O(L) per head for q, k, v and r, never an (L, L, d_rel) tensor nor
all L rows of profiles at once.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from .. import _checks
from ..kernels.blocked_common import check_qkv
from ..kernels.query_blocked import query_blocked_attention
from .content import ContentBias

__all__ = ["BandedBias", "BandedRelative", "banded_attention", "banded_bias"]

# Temporaries per score of a block (scores, the scattered sum, the masked sum, softmax and the backward's
# gradients of each), which sizes the blocks (query_blocked.default_block); the (n, m) profiles are smaller.
_WIDTH = 10


class BandedRelative(nn.Module):
    """Inkling's relative branch for one layer: r = x W^T per head, and the table P of profiles.

    Args:
        d_model: the hidden state's width.
        n_heads: query heads of the layer (one r per head; with grouped-query attention, per query head).
        d_rel: the width of r and the rows of P (Inkling: 16).
        extent: the distances 0 .. extent - 1 that get a bias (Inkling: 1024 in its global layers, the
            sliding window, 512, in its local ones).

    Attributes: ``proj`` (``nn.Linear(d_model, n_heads * d_rel, bias=False)``) and ``table`` P
    (d_rel, extent), column d the profile of distance d, both N(0, 0.02^2).

    forward(x (batch, seq, d_model)) -> a :class:`BandedBias` of r (batch, n_heads, seq, d_rel) in x's dtype
    (:meth:`states`) and P: ``posenc.attention(q, k, v, bias=rel(x))``.
    """

    def __init__(self, d_model: int, n_heads: int, d_rel: int = 16, extent: int = 1024):
        super().__init__()
        self.d_model = _checks.positive_int("d_model", d_model, size=True)
        self.n_heads = _checks.positive_int("n_heads", n_heads, size=True)
        self.d_rel = _checks.positive_int("d_rel", d_rel, size=True)
        self.extent = _checks.positive_int("extent", extent, size=True)
        self.proj = nn.Linear(self.d_model, self.n_heads * self.d_rel, bias=False)
        self.table = nn.Parameter(torch.empty(self.d_rel, self.extent))
        # small, as the Hugging Face port (initializer_range 0.02): the bias starts near 0, content attention
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.normal_(self.table, std=0.02)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, d_rel={self.d_rel}, extent={self.extent}"

    def states(self, x: torch.Tensor) -> torch.Tensor:
        """r (batch, n_heads, seq, d_rel) of x (batch, seq, d_model)."""
        _checks.tensor_rank("x", x, 3)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq, {self.d_model}), got {tuple(x.shape)}")
        return self.proj(x).unflatten(-1, (self.n_heads, self.d_rel)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> BandedBias:
        return BandedBias(self.states(x), self.table)


class BandedBias(ContentBias):
    """Inkling's banded relative bias for one call, as :func:`posenc.attention`'s ``bias=``: query i and key
    j get r_i . P[:, i - j] for 0 <= i - j < extent, 0 beyond; causal only.

    Args:
        rel_states: r (batch, heads, q_len, d_rel), one per query head and query (a
            :class:`BandedRelative`'s :meth:`~BandedRelative.states`); with a KV cache, the new queries' r
            only. Finite; differentiable.
        rel_table: P (d_rel, extent), extent >= 1, shared by the heads (``BandedRelative.table``); finite;
            differentiable.

    Both are checked against q at the call.
    """

    causal_only = True

    def __init__(self, rel_states: torch.Tensor, rel_table: torch.Tensor):
        super().__init__()
        self.rel_states, self.rel_table = rel_states, rel_table

    def scaled(self, factor: torch.Tensor) -> BandedBias:
        """This bias with every r_i multiplied by ``factor`` (broadcast against (batch, heads, q_len, 1)):
        a temperature on the whole score row multiplies r as it multiplies q (Inkling's tau)."""
        return BandedBias(self.rel_states * factor.to(self.rel_states.dtype), self.rel_table)

    def attend(self, q, k, v, *, causal: bool = True, scale: float | None = None, block: int | None = None):
        """:func:`banded_attention` with r and P; refuses ``causal=False``."""
        if causal is not True:
            raise ValueError(
                "BandedBias works with causal attention only (query i reads the profile of distance "
                f"i - j >= 0), got causal={causal!r}"
            )
        return banded_attention(q, k, v, self.rel_states, self.rel_table, scale=scale, block=block)


def _check_terms(rel_states, rel_table, q: torch.Tensor) -> None:
    """rel_table a finite float (d_rel, extent), d_rel and extent >= 1; rel_states a finite float
    (batch, heads, q_len, d_rel) matching q."""
    if not isinstance(rel_table, torch.Tensor) or not rel_table.is_floating_point() or rel_table.dim() != 2:
        got = rel_table.dtype if isinstance(rel_table, torch.Tensor) else type(rel_table).__name__
        got = tuple(rel_table.shape) if isinstance(rel_table, torch.Tensor) and rel_table.dim() != 2 else got
        raise ValueError(f"rel_table must be a float tensor of shape (d_rel, extent), got {got}")
    if min(rel_table.shape) < 1:
        raise ValueError(
            f"rel_table must have d_rel >= 1 rows and extent >= 1 columns (a profile per distance "
            f"0 .. extent - 1), got shape {tuple(rel_table.shape)}"
        )
    want = (*q.shape[:3], rel_table.shape[0])
    if not isinstance(rel_states, torch.Tensor) or not rel_states.is_floating_point():
        got = rel_states.dtype if isinstance(rel_states, torch.Tensor) else type(rel_states).__name__
        raise ValueError(
            f"rel_states must be a float tensor of shape (batch, heads, q_len, d_rel) = {want}, got {got}"
        )
    if tuple(rel_states.shape) != want:
        raise ValueError(
            f"rel_states must have shape (batch, heads, q_len, d_rel) = {want} (one r per query head and "
            f"query; d_rel from rel_table), got {tuple(rel_states.shape)}"
        )
    for name, t in (("rel_states", rel_states), ("rel_table", rel_table)):
        if _checks.can_read(t) and t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite, got {t[~torch.isfinite(t)][0].item()}")


def _band(q_pos: torch.Tensor, k_pos: torch.Tensor, m: int):
    """(n, m) key index of distance d = 0 .. m-1 from each query, clamped into the keys, and whether that key
    exists (a query near the start has fewer than m keys behind it)."""
    cols = (q_pos - k_pos[:1])[:, None] - torch.arange(m, device=q_pos.device)[None, :]
    inside = (cols >= 0) & (cols < k_pos.shape[0])
    return cols.clamp(0, k_pos.shape[0] - 1), inside


def _block(q, k, v, q_pos, k_pos, causal: bool, scale: float, r, table, *, first: int) -> torch.Tensor:
    """One block of queries (B, Hk, G, n, D) at q_pos against keys (B, Hk, nk, D) at k_pos; r
    (B, H, Lq, d_rel) the rows of every query (query position p is row p - first), table (d_rel, extent).
    Returns (B, Hk, G, n, Dv)."""
    lead = q.shape[:4]
    m = min(table.shape[1], k_pos.shape[0])  # distances past the block's keys are never read
    rows = r.unflatten(1, lead[1:3])[
        ..., q_pos - first, :
    ]  # (B, Hk, G, n, d_rel): head h reads kv head h // G
    profiles = rows @ table[:, :m]  # (B, Hk, G, n, m): r_i . P[:, d]
    cols, inside = _band(q_pos, k_pos, m)
    logits = ((q * scale).flatten(2, 3) @ k.transpose(-1, -2)).unflatten(2, lead[2:])
    # the band: distance d of query i lands on key i - d; the missing keys of the first rows add nothing
    logits = logits.scatter_add(-1, cols.expand(*lead, m), torch.where(inside, profiles, 0.0))
    future = k_pos[None, :] > q_pos[:, None]
    # every query sees its own key, so no row is all -inf and no softmax gives NaN
    p = torch.softmax(logits.masked_fill(future, -math.inf), dim=-1)
    return (p.flatten(2, 3) @ v).unflatten(2, lead[2:])


def banded_bias(rel_states: torch.Tensor, rel_table: torch.Tensor, k_len: int) -> torch.Tensor:
    """The bias b_ij = r_i . P[:, i - j] for 0 <= i - j < extent, else exactly 0, materialised:
    (batch, heads, q_len, k_len) for rel_states (batch, heads, q_len, d_rel) of the last q_len of k_len
    positions and rel_table (d_rel, extent). For inspection and tests: :func:`banded_attention` never builds
    it."""
    k_len = _checks.positive_int("k_len", k_len)
    lq = rel_states.shape[-2]
    if lq > k_len:
        raise ValueError(f"rel_states has {lq} queries, more than k_len={k_len} (queries are the last keys)")
    q_pos = torch.arange(k_len - lq, k_len, device=rel_states.device)
    m = min(rel_table.shape[1], k_len)
    cols, inside = _band(q_pos, torch.arange(k_len, device=rel_states.device), m)
    profiles = rel_states @ rel_table[:, :m].to(rel_states.dtype)
    out = profiles.new_zeros(*profiles.shape[:-1], k_len)
    return out.scatter_add(-1, cols.expand(*profiles.shape[:-1], m), torch.where(inside, profiles, 0.0))


def banded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_states: torch.Tensor,
    rel_table: torch.Tensor,
    *,
    scale: float | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Causal softmax attention with Inkling's banded relative bias b_ij = r_i . P[:, i - j] (module
    docstring).

    Args:
        q: (batch, heads, q_len, head_dim); k: (batch, kv_heads, k_len, head_dim); v: (batch, kv_heads,
            k_len, v_dim); kv_heads divides heads (grouped-query attention). Queries are the last q_len of
            the k_len positions (decoding with a KV cache).
        rel_states: r (batch, heads, q_len, d_rel), one per query head and query (a
            :class:`BandedRelative`'s output); finite; differentiable.
        rel_table: P (d_rel, extent), extent >= 1, shared by the heads; finite; differentiable.
        scale: score scale, default 1/sqrt(head_dim).
        block: queries per block (default: sized by :func:`posenc.kernels.query_blocked.default_block`).

    Returns:
        (batch, heads, q_len, v_dim) in q's dtype. Computed in float32 (float64 for float64 q).
    """
    check_qkv(q, k, v, block)
    _check_terms(rel_states, rel_table, q)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _checks.positive_float("scale", scale)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    fn = functools.partial(_block, first=k.shape[2] - q.shape[2])
    params = (rel_states.to(work), rel_table.to(work))
    out = query_blocked_attention(
        fn, q.to(work), k.to(work), v.to(work), params, causal=True, scale=scale, width=_WIDTH, block=block
    )
    return out.to(q.dtype)
