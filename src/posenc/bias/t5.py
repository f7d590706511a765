"""T5's bucketed relative-position bias (Raffel et al. 2020, arxiv.org/abs/1910.10683, section 2.1)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _checks
from .base import ScoreBias

__all__ = ["T5Bias", "t5_relative_bucket"]


def t5_relative_bucket(
    relative: torch.Tensor, bidirectional: bool = False, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of each relative position ``relative`` = key - query (an integer tensor), as transformers'
    ``T5Attention._relative_position_bucket`` computes it (float32 logarithm, truncation).

    Half of the buckets (of each direction when bidirectional) hold the exact distances 0 .. n/2 - 1, the
    rest logarithmically wider bins up to ``max_distance``; farther distances share the last bucket. For 32
    buckets, 128 and a causal decoder the last bucket starts at distance 113, not 128.
    """
    relative = relative.long()
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = -torch.clamp(relative, max=0)
    max_exact = num_buckets // 2
    large = max_exact + (
        torch.log(distance.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class T5Bias(ScoreBias):
    """T5 relative attention bias: b_h(i, j) = weight[bucket(j - i), h], a learned (num_buckets, n_heads)
    table (Raffel et al. 2020); equal to transformers' ``T5Attention.compute_bias`` for the same weights.

    Args:
        n_heads: attention heads.
        num_buckets: rows of the table (T5: 32).
        max_distance: distance from which every key shares the last bucket (T5: 128).
        bidirectional: encoder buckets (half for keys after the query); decoders use False.

    T5 does not scale scores by 1/sqrt(head_dim): call ``posenc.attention(q, k, v, bias=t5, scale=1.0)``.
    The weights start as N(0, 0.05^2), about T5's d_model^-1/2 for d_model = 512 (its initialisation);
    :meth:`from_transformers` loads a checkpoint's table.
    """

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional=False):
        super().__init__()
        self.n_heads = _checks.positive_int("n_heads", n_heads, size=True)
        self.num_buckets = _checks.positive_int(
            "num_buckets", num_buckets, minimum=4 if bidirectional else 2, size=True
        )
        self.max_distance = _checks.positive_int("max_distance", max_distance)
        exact = num_buckets // (4 if bidirectional else 2)
        if max_distance <= exact:
            raise ValueError(
                f"max_distance must be > the {exact} exactly-bucketed distances of "
                f"num_buckets={num_buckets}, got {max_distance}"
            )
        if not isinstance(bidirectional, bool):
            raise ValueError(f"bidirectional must be True or False, got {bidirectional!r}")
        self.bidirectional = bidirectional
        self.weight = nn.Parameter(torch.randn(num_buckets, n_heads) * 0.05)

    def table(self, distance: torch.Tensor) -> torch.Tensor:
        relative = -torch.round(distance).long()  # key - query
        bucket = t5_relative_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.weight[bucket].T

    @classmethod
    def from_transformers(cls, attention_module) -> T5Bias:
        """A T5Bias holding a copy of a transformers ``T5Attention``'s table (the layer that owns it: the
        first of each stack; ``has_relative_attention_bias`` must be True). Encoders are bidirectional,
        decoders not."""
        if not getattr(attention_module, "has_relative_attention_bias", False):
            raise ValueError(
                f"attention_module must be a T5Attention with has_relative_attention_bias=True (the first "
                f"layer of a stack), got {type(attention_module).__name__}"
            )
        weight = attention_module.relative_attention_bias.weight.detach()
        out = cls(
            weight.shape[1],
            num_buckets=attention_module.relative_attention_num_buckets,
            max_distance=attention_module.relative_attention_max_distance,
            bidirectional=not attention_module.is_decoder,
        ).to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            out.weight.copy_(weight)
        return out

    def extra_repr(self) -> str:
        return (
            f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}"
        )
