"""What the laboratory's model reads about positions: one :class:`Encoding` per scheme.

A scheme's builder (:mod:`posenc.lab.encodings`) returns one; an eval-time extension
(:mod:`posenc.lab.extensions`) returns a changed copy. The model (:mod:`posenc.lab.model`) reads only this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

import posenc
from posenc.bias.base import ScoreBias
from posenc.lab.checks import check_number
from posenc.lab.errors import LabError

__all__ = [
    "Encoding",
    "KeyTerm",
    "Layer",
    "QueryScale",
    "QueryTerm",
    "floored_log_length",
    "sliding_causal_mask",
]


@dataclass(frozen=True)
class QueryScale:
    """A per-row query scale: the query of a row that sees n keys is multiplied by s_h * length(n), s a
    scalar per head and layer, before :func:`posenc.attention` (so before any rotary: a scalar per row
    commutes with a rotation). With ``length = log`` this is scalable softmax (SSMax; Nakanishi 2025,
    arxiv.org/abs/2501.19399): softmax(s log(n) z) keeps a row as sharp at n keys as at a few, where a
    plain softmax flattens as n grows.

    length: ``fn(n) -> factor``, n a float32 tensor of key counts (q_len,); log for SSMax.
    init: s at the start of training, for every head and layer.
    learned: s is a parameter of the model, one (heads,) per layer; False: the constant ``init``.
    """

    length: Callable[[torch.Tensor], torch.Tensor] = torch.log
    init: float = 1.0
    learned: bool = True

    def __post_init__(self):
        if not callable(self.length):
            raise LabError(f"QueryScale length={self.length!r} must be a function of the key counts n")
        check_number("QueryScale init", self.init, finite=True, why="s at the start")

    def factor(self, s, keys_seen: torch.Tensor) -> torch.Tensor:
        """(heads, q_len) factors for queries that see ``keys_seen`` (q_len,) keys; ``s`` (heads,) or a
        number."""
        s = torch.as_tensor(s, dtype=torch.float32, device=keys_seen.device).reshape(-1, 1)
        return s * self.length(keys_seen.to(torch.float32))[None, :]


def floored_log_length(n: torch.Tensor, floor: float, alpha: float) -> torch.Tensor:
    """Inkling's log-length temperature (Thinking Machines Lab 2026) of rows that see n keys,
    tau(n) = 1 + alpha log(max(n / floor, 1)): exactly 1 up to ``floor`` keys, then growing like alpha log n
    (a :class:`QueryScale` ``length``, with ``functools.partial`` binding floor and alpha). n (q_len,)."""
    return 1.0 + alpha * torch.log((n / floor).clamp(min=1.0))


@dataclass(frozen=True)
class Encoding:
    """The positional machinery of one scheme, as the model reads it.

    input: adds position to the embeddings, ``(B, T, D), offset -> (B, T, D)``.
    rotary: rotates q and k in every layer (RoPE, xPos), or None.
    bias: the attention bias passed to :func:`posenc.attention` in every layer (ALiBi, T5, KERPLE, ...), or
        None.
    layer_bias: for schemes with parameters of their own in each layer (Shaw et al., CoPE): a function
        called once per layer that returns that layer's bias module; used instead of ``bias``.
    random_positions: randomized positions (Ruoss et al. 2023, arxiv.org/abs/2305.16843): each forward pass
        places its T tokens at a sorted random sample of T distinct positions from 0 .. n-1 (n = this
        value, or T when T is larger), instead of 0 .. T-1. The encodings (``input``'s and ``rotary``'s)
        must take positions. None: ordinary positions.
    train_positions: ``fn(batch, T, device) -> (batch, T)`` position ids for the rotary in training
        forward passes (PoSE's skipping ids, :func:`posenc.lab.recipes.pose_positions`); None: ordinary.
    sinks: a learned logit per head in every layer, one more entry of every softmax row with no value
        (attention sinks: Xiao et al. 2023, arxiv.org/abs/2309.17453, as GPT-OSS learns them), started
        at 0; the model holds them, one (heads,) parameter per layer.
    query_scale: a :class:`QueryScale`: every query multiplied by s_h * length(n), n the keys its row sees
        (SSMax); the model holds s, one (heads,) parameter per layer when learned. None: unscaled.
    window: blockwise causal attention (:func:`posenc.blockwise_causal_mask`): a query sees its own block
        of ``window`` positions and the previous one, on top of any bias; None: every earlier key.
    score_scale: multiplies every attention score (on top of 1/sqrt(head_dim)); 1.0: unchanged.
    sliding: sliding-window attention (:func:`sliding_causal_mask`; Beltagy et al. 2020, Gemma's local
        layers): a query sees itself and the ``sliding - 1`` keys before it; None: every earlier key.
    layers: one :class:`Layer` per transformer block, whose encoding that block attends with (its rotary,
        bias, sliding window, fixed query scale), for schemes whose layers differ (SWAN, Gemma's
        local/global layers, SmolLM3's NoPE layers: :mod:`posenc.lab.layers`); this encoding then gives
        only the input and the positions, and has no rotary or bias of its own. None: every layer this one.
    hidden_terms: position terms computed from the hidden state (FoX's forget gates, Lin et al. 2025,
        arxiv.org/abs/2503.02130): a function called once per layer that returns that layer's module ``m``
        (the model holds them as ``hidden_terms``). Every forward, each layer calls ``m(h, state)`` with
        ``h`` (B, T, D) the normalised hidden state its q, k and v are projected from and ``state`` what
        its KV cache kept from the earlier calls (None without a cache, or on the first call). ``m``
        returns ``(bias, state)``: the content bias of the layer's :func:`posenc.attention` call
        (``bias=``), and what the cache keeps for the next call (None: nothing). A term of the queries
        only (a per-query projection: :class:`QueryTerm`) keeps nothing; a term of the keys keeps the
        cached keys' values (the gates: :class:`KeyTerm`). A module whose ``scaled_by_query`` is true gives
        a bias of per-query values that the layer multiplies by its query scale as it multiplies q
        (``bias.scaled(factor)``).

    Extensions return a changed copy (``dataclasses.replace``); the modifiers combine: two windows keep the
    narrower, two scales multiply (:meth:`narrowed`, :meth:`scaled`).
    """

    input: nn.Module = field(default_factory=posenc.NoPositionalEncoding)
    rotary: nn.Module | None = None
    bias: nn.Module | None = None
    layer_bias: Callable[[], nn.Module] | None = None
    random_positions: int | None = None
    train_positions: Callable | None = None
    sinks: bool = False
    query_scale: QueryScale | None = None
    window: int | None = None
    score_scale: float = 1.0
    hidden_terms: Callable[[], nn.Module] | None = None
    sliding: int | None = None
    layers: tuple[Layer, ...] | None = None

    def narrowed(self, window: int) -> Encoding:
        """This encoding with blockwise causal attention of ``window`` (the narrower of two windows)."""
        return replace(self, window=window if self.window is None else min(self.window, window))

    def scaled(self, factor: float) -> Encoding:
        """This encoding with every attention score multiplied by ``factor`` more."""
        return replace(self, score_scale=self.score_scale * factor)

    def attend(self, bias, q_len: int, k_len: int, head_dim: int, device) -> dict:
        """The keyword arguments of :func:`posenc.attention` for one layer whose bias is ``bias``
        (``self.bias`` or the layer's own): the rotary, the bias with the window applied, the score scale."""
        out: dict = {"rotary": self.rotary, "bias": bias}
        mask = self._mask(q_len, k_len, device)
        if mask is not None:
            out["bias"] = _windowed(bias, mask)
        if self.score_scale != 1.0:
            out["scale"] = self.score_scale / math.sqrt(head_dim)
        return out

    def keys_seen(self, q_len: int, k_len: int, device) -> torch.Tensor:
        """(q_len,) how many keys each query sees: the queries are the last q_len of k_len positions, so
        k_len - q_len + 1 .. k_len under the causal mask, fewer under a window."""
        mask = self._mask(q_len, k_len, device)
        if mask is not None:
            return mask.sum(-1)
        return torch.arange(k_len - q_len + 1, k_len + 1, device=device)

    def _mask(self, q_len: int, k_len: int, device) -> torch.Tensor | None:
        """(q_len, k_len) the keys the windows leave each query (both, when blockwise and sliding), or None
        when there is no window."""
        mask = None
        if self.window is not None:
            mask = posenc.blockwise_causal_mask(q_len, k_len, self.window, device=device)
        if self.sliding is not None:
            near = sliding_causal_mask(q_len, k_len, self.sliding, device=device)
            mask = near if mask is None else mask & near
        return mask


@dataclass(frozen=True)
class Layer:
    """One block's share of a per-layer plan: ``kind`` as the plan spells it with every option resolved
    (``"local:window=16:base=10000.0"``, what provenance records) and the ``encoding`` it attends with."""

    kind: str
    encoding: Encoding


def sliding_causal_mask(q_len: int, k_len: int, window: int, device=None) -> torch.Tensor:
    """Boolean (q_len, k_len), True where a query may attend under sliding-window causal attention: the
    queries are the last q_len of k_len positions, and query i sees the keys j with i - window < j <= i."""
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return (j <= i) & (j > i - window)


def _windowed(bias, mask: torch.Tensor):
    """``bias`` restricted to the keys ``mask`` (q_len, k_len) allows: the mask itself without a bias, a
    score bias (ALiBi, T5, ...) materialised with -inf outside the mask; refused for a bias that reads the
    queries (Shaw et al., CoPE), which cannot be materialised."""
    if bias is None:
        return mask
    if isinstance(bias, ScoreBias):  # ALiBi, T5, KERPLE, Sandwich, FIRE
        scores = bias.bias(mask.shape[0], mask.shape[1], causal=True)  # (heads, q_len, k_len)
        return scores.masked_fill(~mask, -math.inf)
    raise LabError(
        f"an attention window cannot be combined with a {type(bias).__name__}: its bias depends on the "
        "queries and keys, so it cannot be materialised under the window"
    )


class KeyTerm(nn.Module):
    """A hidden-state term of the keys, for :attr:`Encoding.hidden_terms`: ``module(h)`` gives the call's
    content bias, whose values belong to every token and are read by every later query (FoX: a
    :class:`posenc.ForgetGate`'s :class:`posenc.ForgetBias`), so the KV cache keeps the bias of its tokens
    and each call's bias is the cached tokens' followed by the new ones (``bias.after(cached)``)."""

    scaled_by_query = False

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, h: torch.Tensor, state) -> tuple:
        bias = self.module(h).after(state)
        return bias, bias


class QueryTerm(nn.Module):
    """A hidden-state term of the queries, for :attr:`Encoding.hidden_terms`: ``module(h)`` gives the call's
    content bias of the new queries (Inkling: a :class:`posenc.BandedRelative`'s :class:`posenc.BandedBias`),
    so the KV cache keeps nothing. The layer's query scale multiplies it as it multiplies q
    (``scaled_by_query``, through ``bias.scaled``): a temperature on the whole score row, as Inkling's tau
    scales its position logits with its content logits.
    """

    scaled_by_query = True

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, h: torch.Tensor, state) -> tuple:
        return self.module(h), None
