"""StreamingLLM's key/value cache: the first tokens (attention sinks) and a recent window, with RoPE positions
counted inside the cache (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks",
arxiv.org/abs/2309.17453).

A model attends to its first few tokens with much of its softmax mass whatever they say; evicting them
breaks it. StreamingLLM keeps ``sink_tokens`` first tokens and the ``window`` most recent ones, and gives the
kept tokens the positions 0 .. n-1 they hold in the cache, not their positions in the text, so no query
meets a distance past sink_tokens + window. The keys are kept unrotated and rotated at their cache
positions at every step: the result equals a fresh forward pass over the kept tokens at those positions
exactly. (Keeping rotated keys and re-rotating them by -1 at every eviction, :func:`posenc.rerotate_keys`,
rounds them again each step: in half precision that drifts.)
"""

from __future__ import annotations

import torch

from .. import _checks
from .embedding import RotaryEmbedding

__all__ = ["StreamingKVCache"]


class StreamingKVCache:
    """Keys and values of one attention layer: the first ``sink_tokens`` and the last ``window`` tokens.

    Args:
        rotary: the layer's :class:`posenc.RotaryEmbedding` (or :class:`posenc.XPos`: queries scaled as
            queries, keys as keys, about the fixed centre or else the middle of the kept keys, as a forward
            pass over them).
        sink_tokens: the first tokens always kept (StreamingLLM uses 4).
        window: the most recent tokens kept besides them.

    Shape:
        update(q, k, v) takes the new tokens, each (batch, heads, new, head_dim) (k, v may have fewer heads;
        new <= window), evicts the oldest tokens past the sinks to make room, and returns (q rotated at the
        new tokens' cache positions, every kept key rotated at its cache position, every kept value): then
        ``posenc.attention(q, k, v)`` without a rotary, or SDPA with the queries bottom-right.
    """

    def __init__(self, rotary: RotaryEmbedding, sink_tokens: int = 4, window: int = 1020):
        if not isinstance(rotary, RotaryEmbedding):
            raise ValueError(f"rotary must be a posenc.RotaryEmbedding, got {type(rotary).__name__}")
        self.rotary = rotary
        self.sink_tokens = _checks.non_negative_int("sink_tokens", sink_tokens)
        self.window = _checks.positive_int("window", window)
        self.keys: torch.Tensor | None = None  # unrotated
        self.values: torch.Tensor | None = None
        self.seen = 0  # tokens given to update() so far, kept or not

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def reset(self) -> None:
        self.keys = self.values = None
        self.seen = 0

    def update(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for name, t in (("q", q), ("k", k), ("v", v)):
            _checks.tensor_rank(name, t, 3)
        new = k.shape[-2]
        if not q.shape[-2] == new == v.shape[-2]:
            raise ValueError(
                f"q, k and v must hold the same new tokens, got lengths {q.shape[-2]}, {new}, {v.shape[-2]}"
            )
        if new > self.window:
            raise ValueError(
                f"update() takes at most window={self.window} new tokens at a time (they must all fit in the "
                f"cache to attend to each other), got {new}"
            )
        if self.keys is not None and (
            k.shape[:-2] != self.keys.shape[:-2] or v.shape[:-2] != self.values.shape[:-2]
        ):
            raise ValueError(
                f"k and v must keep the cached (batch, kv_heads) = {tuple(self.keys.shape[:-2])}, got k "
                f"{tuple(k.shape)} and v {tuple(v.shape)}; reset() the cache to start another stream"
            )
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            room = self.sink_tokens + self.window - new  # the old tokens that can stay (>= sink_tokens)
            if self.length > room:
                cut = self.length - (room - self.sink_tokens)  # the recent tokens kept start here
                self.keys = torch.cat((self.keys[..., : self.sink_tokens, :], self.keys[..., cut:, :]), -2)
                self.values = torch.cat(
                    (self.values[..., : self.sink_tokens, :], self.values[..., cut:, :]), -2
                )
            self.keys = torch.cat((self.keys, k), -2)
            self.values = torch.cat((self.values, v), -2)
        self.seen += new
        n = self.length  # one schedule and xPos centre for q and k: a forward pass over the n kept tokens
        q_rot = self.rotary.rotate_cached(q, n - new, n, "q")
        return q_rot, self.rotary.rotate_cached(self.keys, 0, n, "k"), self.values
