"""Contextual position encoding, CoPE (Golovneva, Wang, Weston and Sukhbaatar 2024, "Contextual Position
Encoding: Learning to Count What's Important", arxiv.org/abs/2405.18719, eq. 3-5), as its reference code
computes it (facebookresearch/RAM, projects/cope, ``ContextPosSelfAttn`` with the default flags).

Per head and query i, over the keys j <= i:
  gates g_ij = sigmoid(q_i . k_j * scale), 0 for masked keys;
  positions p_ij = min(sum_{t = j..i} g_it, npos_max - 1)   (a reverse cumulative sum over keys);
  e[p] = q_i . pos_emb[:, p] * scale at the integer positions p = 0 .. npos_max - 1;
  bias_ij = e[ceil p_ij] * w + e[floor p_ij] * (1 - w),  w = p_ij - floor p_ij;
  out_i = sum_j softmax_j(q_i . k_j * scale + bias_ij) v_j.

The reference divides q . k and the position logits together by sqrt(head_dim) (``--cope-nodiv`` off), so
the position term is scaled like the scores; ceil and floor carry no gradient, w does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from .content import ContentBias

__all__ = ["CoPE"]


class CoPE(ContentBias):
    """Contextual position encoding for one attention layer: a learned (head_dim, npos_max) table of position
    embeddings, shared across heads; gates from the attention's own q . k. Causal only.

    Args:
        head_dim: q's and k's last dimension.
        npos_max: the number of integer positions; counts past npos_max - 1 are clamped to it (the reference
            uses the training length + 1, since a count of 0 is possible).

    ``pos_emb`` starts at zero, as in the reference. Each block of queries computes its rows of gates, the
    reverse cumulative sum along the keys, the interpolated bias and its output, and the backward recomputes
    them block by block, so no (heads, L, L) tensor lives (:mod:`posenc.kernels.query_blocked`).
    """

    causal_only = True
    width = 24  # gates, their reverse cumsum, floor/ceil indices, two gathers, ... per score

    def __init__(self, head_dim: int, npos_max: int):
        super().__init__()
        self.head_dim = _checks.positive_int("head_dim", head_dim, size=True)
        self.npos_max = _checks.positive_int("npos_max", npos_max, size=True)
        self.pos_emb = nn.Parameter(torch.zeros(self.head_dim, self.npos_max))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, npos_max={self.npos_max}"

    def parameters_for_block(self) -> tuple[torch.Tensor, ...]:
        return (self.pos_emb,)

    def block(self, q, k, v, q_pos, k_pos, causal: bool, scale: float, pos_emb) -> torch.Tensor:
        qs = q * scale
        lead = qs.shape[:4]
        logits = (qs.flatten(2, 3) @ k.transpose(-1, -2)).unflatten(2, lead[2:])  # (B, Hk, G, n, nk)
        future = k_pos[None, :] > q_pos[:, None]
        gates = torch.sigmoid(logits).masked_fill(future, 0.0)
        positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)
        # a count over nk keys is at most nk: the columns past it are never read
        at_integers = qs @ pos_emb[:, : min(self.npos_max, k_pos.shape[0] + 1)]  # (B, Hk, G, n, <= npos_max)
        floor = positions.detach().floor()
        w = positions - floor
        bias = at_integers.gather(-1, positions.detach().ceil().long()) * w + at_integers.gather(
            -1, floor.long()
        ) * (1 - w)
        p = torch.softmax((logits + bias).masked_fill(future, -math.inf), dim=-1)
        return (p.flatten(2, 3) @ v).unflatten(2, lead[2:])
