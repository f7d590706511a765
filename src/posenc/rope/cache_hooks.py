"""What :class:`posenc.RotaryKVCache` and :func:`posenc.rerotate_keys` ask of a rotary embedding besides
rotating: RoPE's answers, which :class:`~.xpos.XPos` (it also scales queries and keys about a centre,
Sun et al. 2022) overrides.

A mixin of its own so that :class:`~.embedding.RotaryEmbedding` holds the rotation alone, and the cache
(:mod:`.cache`) depends on these three methods only.
"""

from __future__ import annotations

import torch

__all__ = ["CacheHooks"]


class CacheHooks:
    """RoPE's cache hooks: every cache mode works, queries and keys rotate alike, a shift only rotates."""

    def check_cache_mode(self, mode: str) -> None:
        """Refuse a RotaryKVCache mode this rotary cannot keep consistent (RoPE: every mode works)."""

    def rotate_cached(self, x: torch.Tensor, offset: int, total: int, kind: str) -> torch.Tensor:
        """x (..., seq, head_dim) at positions offset.. as a forward pass over ``total`` tokens rotates it,
        as queries (``kind="q"``) or keys (``"k"``); RoPE treats both alike."""
        return self.rotate(x, offset=offset, context_len=total)

    def shift_scale(self, delta: torch.Tensor) -> torch.Tensor | None:
        """The factor per pair, (..., rotary_dim/2) float64, by which moving keys ``delta`` positions scales
        them besides rotating them; None when it does not (RoPE)."""
        return None
