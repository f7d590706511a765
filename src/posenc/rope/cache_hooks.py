"""What :class:`posenc.RotaryKVCache`, :class:`posenc.StreamingKVCache`, :func:`posenc.rerotate_keys` and
the remaps' views (:mod:`posenc.remap`) ask of a rotary embedding besides rotating: RoPE's answers, which
:class:`~.xpos.XPos` (it also scales queries and keys about a centre, Sun et al. 2022) overrides.

A mixin of its own so that :class:`~.embedding.RotaryEmbedding` holds the rotation alone, and the caches
(:mod:`.cache`, :mod:`.streaming`) and the remaps depend on these methods only. Every one that rotates keys
takes ``kind``: a subclass whose keys differ from its queries (xPos) must never be handed keys as queries.
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

    def rotate_as(
        self, x: torch.Tensor, positions: torch.Tensor, kind: str, *, context_len=None, centre=None
    ) -> torch.Tensor:
        """x (..., seq, head_dim) at ``positions`` (seq,) as queries (``kind="q"``) or keys (``"k"``) that
        meet only each other, with the schedule of ``context_len``; ``centre`` (a number or a (1,) tensor):
        where a rotary that scales about a centre (xPos) centres both, unless it has its own. RoPE treats
        both kinds alike and has no centre."""
        return self.rotate(x, positions=positions, context_len=context_len)

    def shift_scale(self, delta: torch.Tensor) -> torch.Tensor | None:
        """The factor per pair, (..., rotary_dim/2) float64, by which moving keys ``delta`` positions scales
        them besides rotating them; None when it does not (RoPE)."""
        return None
