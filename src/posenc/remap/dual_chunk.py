"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models",
arxiv.org/abs/2402.17463; Qwen2.5-1M, arxiv.org/abs/2501.15383), with the positions of vLLM's
``DualChunkRotaryEmbedding``."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .. import _checks
from .base import Remap, View

__all__ = ["DualChunk"]


class DualChunk(Remap):
    """Attention by chunks of c = chunk_size - local_size tokens, every key at its place in its chunk.

    Keys sit at j mod c. A query scores the keys of its own chunk (intra) at i mod c, those of the chunk
    before (successive) at min(i mod c + c, chunk_size), and all earlier ones (inter) at
    min(2c - 1, chunk_size): no distance ever exceeds chunk_size, however long the sequence. The three
    views are merged by their log-sum-exps, one softmax over all keys.

    Args:
        chunk_size: the chunk size of the model's ``dual_chunk_attention_config`` (its trained length, for
            Qwen2.5-1M 262144).
        local_size: the local window of that config (8192 for Qwen2.5-1M); chunk_size - local_size >= 1.
        original_max_position_embeddings: kept from the config, for reference (the positions do not use it).
    """

    def __init__(self, chunk_size: int, local_size: int, original_max_position_embeddings: int | None = None):
        self.chunk_size = _checks.positive_int("chunk_size", chunk_size, position=True)
        self.local_size = _checks.non_negative_int("local_size", local_size, position=True)
        if self.local_size >= self.chunk_size:
            raise ValueError(
                f"local_size must be < chunk_size (chunks of chunk_size - local_size tokens), got local_size="
                f"{local_size} >= chunk_size={chunk_size}"
            )
        if original_max_position_embeddings is not None:
            original_max_position_embeddings = _checks.positive_int(
                "original_max_position_embeddings", original_max_position_embeddings, position=True
            )
        self.original_max_position_embeddings = original_max_position_embeddings

    @classmethod
    def from_config(cls, config) -> DualChunk:
        """From a transformers config (or config.json dict) with a ``dual_chunk_attention_config``."""
        get = (lambda c, k: c.get(k)) if isinstance(config, Mapping) else (lambda c, k: getattr(c, k, None))
        dca = get(config, "dual_chunk_attention_config")
        if not isinstance(dca, Mapping):
            raise ValueError(f"config has no dual_chunk_attention_config dict, got {dca!r}")
        missing = [k for k in ("chunk_size", "local_size") if dca.get(k) is None]
        if missing:
            raise ValueError(f"dual_chunk_attention_config is missing {missing}; it has {sorted(dca)}")
        return cls(dca["chunk_size"], dca["local_size"], dca.get("original_max_position_embeddings"))

    def __repr__(self) -> str:
        return f"DualChunk(chunk_size={self.chunk_size}, local_size={self.local_size})"

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_size

    def views(self, i: torch.Tensor, j: torch.Tensor) -> tuple[View, ...]:
        c, size = self.chunk_len, self.chunk_size
        key = (j % c).double()
        within = i % c
        return (
            View(within.double(), key, 0, 1, unit=c),
            View((within + c).clamp(max=size).double(), key, 1, 2, unit=c),
            View(torch.full_like(i, min(2 * c - 1, size), dtype=torch.float64), key, 2, math.inf, unit=c),
        )

    def distance(self, d: float) -> float:
        # the largest remapped distance any pair d apart can get: inside a chunk d itself; beyond, at most
        # the successive or inter query's position
        c = self.chunk_len
        return d if d < c else min(max(d, c - 1), min(2 * c - 1, self.chunk_size))

    def check_length(self, k_len: int, trained: int | None) -> None:
        """Any length fits a model trained at chunk_size or more: a query sits at chunk_size at most (its
        distance to a key at 0 is chunk_size, as vLLM computes it, one past the trained positions when
        chunk_size equals the trained length, as in Qwen2.5-1M's config)."""
        if trained is not None and self.chunk_size > trained:
            raise ValueError(
                f"{self!r}: chunk_size={self.chunk_size} is past the rotary's max_position_embeddings="
                f"{trained}: queries would sit at positions the model never saw; lower chunk_size to it"
            )
