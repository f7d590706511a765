"""The content-bias protocol: position terms that depend on the query (and key) content as well as on
positions, so that no (heads, q_len, k_len) table can be precomputed, unlike a
:class:`~posenc.bias.base.ScoreBias`.

A subclass gives :meth:`ContentBias.block`, the materialised attention of a block of queries against the
keys they see (see :mod:`posenc.kernels.query_blocked` for its shapes); :meth:`ContentBias.attend` runs it
block by block in O(L) memory per head, and :func:`posenc.attention` calls ``attend`` for such a bias
(after rotating q and k when a rotary embedding is given as well).

Positions are absolute: with q_len < k_len the queries are the *last* q_len of the k_len positions.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from ..kernels.blocked_common import check_qkv
from ..kernels.query_blocked import query_blocked_attention

__all__ = ["ContentBias"]


class ContentBias(nn.Module):
    """Base class of content-dependent position schemes (see the module docstring).

    Subclasses set ``self.head_dim`` (q's and k's last dimension), optionally ``self.v_dim`` (v's, None:
    any), ``causal_only`` (the scheme has no bidirectional form) and ``width`` (the (n, keys) temporaries
    :meth:`block` holds per score, which sizes the blocks), and implement :meth:`block` and
    :meth:`parameters_for_block`.
    """

    causal_only: bool = False
    width: int = 8
    v_dim: int | None = None

    def block(self, q, k, v, q_pos, k_pos, causal: bool, scale: float, *params) -> torch.Tensor:
        """Attention of queries q (B, Hk, G, n, D) at q_pos (n,) over keys k (B, Hk, nk, D) and values
        v (B, Hk, nk, Dv) at k_pos (nk,); returns (B, Hk, G, n, Dv)."""
        raise NotImplementedError(f"{type(self).__name__} must implement block()")

    def parameters_for_block(self) -> tuple[torch.Tensor, ...]:
        """The tensors :meth:`block` takes after ``scale`` (passed explicitly: the blocked kernel returns
        their gradients)."""
        return ()

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = True,
        scale: float | None = None,
        block: int | None = None,
    ) -> torch.Tensor:
        """softmax(scores) v with this scheme's position terms. q (B, H, Lq, D); k (B, Hk, Lk, D);
        v (B, Hk, Lk, Dv), Hk dividing H, Lq <= Lk (queries are the last Lq positions). ``scale``: default
        1/sqrt(D); ``block``: queries per block (default: sized by
        :func:`~posenc.kernels.query_blocked.default_block`). Returns (B, H, Lq, Dv) in q's dtype."""
        name = type(self).__name__
        check_qkv(q, k, v, block)
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be True or False, got {causal!r}")
        if self.causal_only and not causal:
            raise ValueError(
                f"{name} is causal only (its positions count the keys up to the query); got causal=False"
            )
        for arg, t, want in (("q", q, self.head_dim), ("k", k, self.head_dim), ("v", v, self.v_dim)):
            if want is not None and t.shape[-1] != want:
                raise ValueError(f"{arg} has last dimension {t.shape[-1]}, but {name} was built for {want}")
        scale = 1.0 / math.sqrt(self.head_dim) if scale is None else _checks.positive_float("scale", scale)
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        params = tuple(p.to(work) for p in self.parameters_for_block())
        out = query_blocked_attention(
            self.block,
            q.to(work),
            k.to(work),
            v.to(work),
            params,
            causal=causal,
            scale=scale,
            width=self.width,
            block=block,
        )
        return out.to(q.dtype)

    def forward(self, q, k, v, *, causal: bool = True, scale: float | None = None) -> torch.Tensor:
        return self.attend(q, k, v, causal=causal, scale=scale)
