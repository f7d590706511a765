"""Relative position representations (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention with Relative Position
Representations", arxiv.org/abs/1803.02155, eq. 3-5).

e_ij = q_i . (k_j + a^K_{c(j - i)}) * scale,  out_i = sum_j softmax_j(e_ij) (v_j + a^V_{c(j - i)}),
c(d) = clip(d, -k, k): two learned (2k + 1, dim) tables over the clipped distance, shared by every head.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from .content import ContentBias

__all__ = ["ShawRelative"]


class ShawRelative(ContentBias):
    """Shaw et al.'s relative position representations a^K and a^V, for one layer (shared across heads).

    Args:
        head_dim: q's and k's last dimension (the width of a^K).
        max_distance: k, the clipping distance: keys farther than k on either side share an end row.
        v_dim: v's last dimension (the width of a^V); default ``head_dim``.

    Attributes: ``key_table`` a^K (2k + 1, head_dim) and ``value_table`` a^V (2k + 1, v_dim); row r is the
    clipped distance j - i = r - k. Both start as tensor2tensor does (``tf.get_variable`` under its default
    ``uniform_unit_scaling`` initializer with gain 1: variance scaling, fan_avg, uniform), which is
    ``nn.init.xavier_uniform_``: U(-a, a), a = sqrt(6 / (2k + 1 + dim)).

    No (L, L, dim) tensor is formed: the a^K term is q @ a^K^T (.., n, 2k + 1) gathered per distance, and the
    a^V term is the probabilities summed per clipped distance (the far keys pile onto the end rows) @ a^V.
    Bidirectional (``causal=False``) and causal.
    """

    width = 8

    def __init__(self, head_dim: int, max_distance: int = 16, v_dim: int | None = None):
        super().__init__()
        self.head_dim = _checks.positive_int("head_dim", head_dim, size=True)
        self.max_distance = _checks.positive_int("max_distance", max_distance, size=True)
        self.v_dim = self.head_dim if v_dim is None else _checks.positive_int("v_dim", v_dim, size=True)
        rows = 2 * self.max_distance + 1
        self.key_table = nn.Parameter(torch.empty(rows, self.head_dim))
        self.value_table = nn.Parameter(torch.empty(rows, self.v_dim))
        nn.init.xavier_uniform_(self.key_table)
        nn.init.xavier_uniform_(self.value_table)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_distance={self.max_distance}, v_dim={self.v_dim}"

    def parameters_for_block(self) -> tuple[torch.Tensor, ...]:
        return (self.key_table, self.value_table)

    def rows(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(nq, nk) long: the table row of each pair, clip(k_pos_j - q_pos_i, -k, k) + k."""
        m = self.max_distance
        return (k_pos[None, :] - q_pos[:, None]).clamp(-m, m) + m

    def key_bias(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The a^K term q_i . a^K_{c(j - i)} (unscaled) of queries q (..., nq, head_dim) at integer positions
        q_pos (nq,) against keys at k_pos (nk,); (..., nq, nk). Materialised: for inspection and tests."""
        rel = q @ self.key_table.to(q.dtype).T
        idx = self.rows(q_pos, k_pos)
        return rel.gather(-1, idx.expand(*rel.shape[:-1], idx.shape[-1]))

    def block(self, q, k, v, q_pos, k_pos, causal: bool, scale: float, a_k, a_v) -> torch.Tensor:
        m = self.max_distance
        # Queries and keys of a block lie among the nk key positions, so no distance reaches nk: past that,
        # the table's rows can never be read. The band is sized by the tensors, not by max_distance.
        if m > k_pos.shape[0]:
            cut = m - k_pos.shape[0]
            a_k, a_v, m = a_k[cut:-cut], a_v[cut:-cut], k_pos.shape[0]
        qs = q * scale
        lead = qs.shape[:4]
        scores = (qs.flatten(2, 3) @ k.transpose(-1, -2)).unflatten(2, lead[2:])  # (B, Hk, G, n, nk)
        # Clipped distances as a band of 2m - 1 exact ones plus two ends, so that both terms are gathers and
        # sums over (n, 2m - 1) and masked passes over (n, nk); a gather / scatter_add over (n, nk) indices is
        # several times slower on the CPU (docs/relative-biases.md).
        d = k_pos[None, :] - q_pos[:, None]
        far = (d <= -m, None if causal else d >= m)  # keys after a causal query are masked anyway
        band = q_pos[:, None] + torch.arange(1 - m, m, device=q.device)[None, :] - k_pos[:1]
        inside = (band >= 0) & (band < k_pos.shape[0])
        band = band.clamp(0, k_pos.shape[0] - 1).expand(*lead, -1)
        rel = qs @ a_k.T  # (B, Hk, G, n, 2m + 1): q_i . a^K_r for every row r
        scores = scores.scatter_add(-1, band, torch.where(inside, rel[..., 1:-1], 0.0))
        for mask, r in zip(far, (0, 2 * m), strict=True):
            if mask is not None:  # in place: scatter_add's and addcmul's backward need not their output
                scores.addcmul_(mask.to(scores.dtype), rel[..., r : r + 1])
        if causal:
            scores.masked_fill_(d > 0, -math.inf)
        p = torch.softmax(scores, dim=-1)
        out = (p.flatten(2, 3) @ v).unflatten(2, lead[2:])
        zero = p.new_zeros(*lead, 1)
        ends = [zero if mask is None else torch.where(mask, p, 0.0).sum(-1, keepdim=True) for mask in far]
        per_row = torch.cat((ends[0], torch.where(inside, p.gather(-1, band), 0.0), ends[1]), dim=-1)
        return out + per_row @ a_v  # per_row: the probability of each clipped distance
