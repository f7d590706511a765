"""Remapped-distance attention: the one computation behind training-free RoPE context extension.

A RoPE score depends on the query and key positions only through their distance d = i - j. A remap
replaces d by f(d), chosen so that no query meets a distance it was not trained on, by scoring each pair
with queries and keys rotated at other positions. Every remap here is piecewise: a few *views*, each a pair
of position vectors (where the queries are rotated, where the keys are rotated) used for the pairs whose
true distance lies in one band [lo, hi); the bands partition [0, inf). SelfExtend, ReRoPE and STRING take
two views: the true positions near the diagonal, and a remapped pair beyond a window.

:func:`remap_attention` rotates q and k once per view, then attends block by block of queries (the
checkpointed kernel of :mod:`posenc.kernels.query_blocked`): each block scores its keys with the view whose
band holds their distance, over the key range that band can reach, so no (heads, L, L) tensor is formed
and the gradients are exact. Causal only: a remapped distance is defined for keys at or before the query.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from .. import _checks
from ..kernels.query_blocked import query_blocked_attention
from ..kernels.remap_blocked import Band, remap_attention_blocked
from ..kernels.remap_flex import remap_attention_flex

__all__ = ["NoRemap", "Remap", "View", "check_sinks", "remap_attention", "view_centre", "views_within"]


@dataclass(frozen=True)
class View:
    """Queries rotated at ``q`` (Lq,) and keys at ``k`` (Lk,) (float64 positions), for the causal pairs whose
    distance d = i - j has lo <= d < hi; with ``unit`` > 1, for those whose chunk distance
    i // unit - j // unit does (Dual Chunk Attention)."""

    q: torch.Tensor
    k: torch.Tensor
    lo: int
    hi: float
    unit: int = 1


class Remap:
    """A remapped-distance scheme (module docstring). Subclasses give :meth:`views` and :meth:`distance`,
    and may give :meth:`query_scale`."""

    def views(self, i: torch.Tensor, j: torch.Tensor) -> tuple[View, ...]:
        """The views for queries at absolute positions ``i`` (Lq,) and keys at ``j`` (Lk,), int64 (the
        queries are the last Lq of the keys' positions)."""
        raise NotImplementedError(f"{type(self).__name__} must implement views()")

    def distance(self, d: float) -> float:
        """The remapped distance f(d) of a true distance d >= 0 (the largest one decides what a model must
        have been trained on)."""
        raise NotImplementedError(f"{type(self).__name__} must implement distance()")

    def query_scale(self, i: torch.Tensor) -> torch.Tensor | None:
        """A factor per query (Lq,) that multiplies it before scoring, or None."""
        return None

    def check_length(self, k_len: int, trained: int | None) -> None:
        """Raise when the largest distance of ``k_len`` tokens, remapped, exceeds the ``trained`` length."""
        if trained is None or k_len < 1:
            return
        far = self.distance(k_len - 1)
        if far > trained - 1:
            raise ValueError(
                f"{self!r} maps {k_len} tokens to distances up to {far:g}, past the rotary's "
                f"max_position_embeddings={trained}: the model never saw them; {self.widen_hint()}"
            )

    def widen_hint(self) -> str:
        return "choose parameters that map the sequence inside the trained length"


class NoRemap(Remap):
    """Every distance as it is: one view at the true positions. With ``sinks=`` this is plain RoPE attention
    with attention sinks."""

    def __repr__(self) -> str:
        return "NoRemap()"

    def views(self, i: torch.Tensor, j: torch.Tensor) -> tuple[View, ...]:
        return (View(i.double(), j.double(), 0, math.inf),)

    def distance(self, d: float) -> float:
        return d

    def check_length(self, k_len: int, trained: int | None) -> None:
        """Nothing to refuse: every distance stays as it is, so this attends as ``attention`` without a
        remap does, at any length."""


def _views_block(q, k, v, q_pos, k_pos, causal, scale, *sinks, bands: tuple, dim: int, offset: int):
    """One block of queries (query_blocked's protocol): q (B, Hk, G, n, V*dim), k (B, Hk, nk, V*dim),
    v (B, Hk, nk, Dv), q_pos and k_pos key indices (absolute positions: + ``offset``); each key scored with
    the view whose band holds the pair; ``sinks`` (H,), if given, one more logit in every row's softmax,
    with no value."""
    i, j = q_pos + offset, k_pos + offset
    shape = (*q.shape[:-1], k.shape[-2])
    scores = q.new_full(shape, -math.inf)
    tracing = _checks.tracing()  # traced, a band's key range would be a data-dependent shape: take them all
    if not tracing:
        p0, p1, k0 = int(i[0]), int(i[-1]) + 1, int(j[0])
    for n, band in enumerate(bands):
        if tracing:
            a, b = 0, k.shape[-2]
        else:
            first, last, _, _ = band.reach(p0, p1)
            a, b = max(first - k0, 0), min(last - k0, k.shape[-2])
            if a >= b:
                continue
        qv, kv = q[..., n * dim : (n + 1) * dim], k[..., a:b, n * dim : (n + 1) * dim]
        s = torch.matmul(qv, kv.unsqueeze(2).transpose(-1, -2)) * scale
        scores[..., a:b] = torch.where(band.inside(i, j[a:b]), s, scores[..., a:b])
    if sinks:
        sink = sinks[0].to(scores.dtype).view(q.shape[1], q.shape[2], 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v.unsqueeze(2))


def check_sinks(sinks, q) -> torch.Tensor:
    """``sinks`` when it is a finite float tensor (heads,) on q's device, else a ValueError naming it."""
    heads = q.shape[1]
    if not isinstance(sinks, torch.Tensor) or sinks.shape != (heads,) or not sinks.is_floating_point():
        got = f"shape {tuple(sinks.shape)}, {sinks.dtype}" if isinstance(sinks, torch.Tensor) else repr(sinks)
        raise ValueError(
            f"sinks must be a float tensor of shape ({heads},), one logit per query head; got {got}"
        )
    if sinks.device != q.device:
        raise ValueError(f"sinks must be on q's device {q.device}, got {sinks.device}")
    if _checks.can_read(sinks) and not bool(torch.isfinite(sinks).all()):
        raise ValueError(f"sinks must be finite, got {sinks.tolist()}")
    return sinks


def _checked_kernel(kernel: str | None, q, k, v, sinks) -> str:
    """The kernel remap_attention runs (its docstring), refused before any work where it cannot run."""
    if kernel is None:
        if q.is_cuda:
            return "flex"
        return "flash" if q.device.type == "cpu" and not _checks.tracing() else "blocks"
    if kernel not in ("flash", "flex", "blocks"):
        raise ValueError(f"kernel must be 'flash', 'flex', 'blocks' or None, got {kernel!r}")
    if kernel == "flash" and q.device.type != "cpu":
        raise ValueError(
            f"kernel='flash' runs torch's CPU flash kernel; q is on {q.device}: use 'flex' or 'blocks'"
        )
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    if kernel == "flex" and not q.is_cuda and grad:
        raise ValueError(
            "kernel='flex' has no backward on the CPU (torch compiles FlexAttention's backward for GPUs "
            "only); use kernel='flash' or 'blocks' to train on the CPU"
        )
    return kernel


def views_within(views: tuple[View, ...], window: int, remap: Remap) -> tuple[View, ...]:
    """The views restricted to true distances below ``window`` (sliding-window attention)."""
    if any(v.unit != 1 for v in views):
        raise ValueError(f"window= limits distances in tokens; {remap!r} bands distances in chunks")
    kept = (dataclasses.replace(v, hi=min(v.hi, window)) for v in views)
    return tuple(v for v in kept if v.lo < v.hi)


def remap_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rotary,
    remap: Remap,
    *,
    offset: int = 0,
    scale: float | None = None,
    block: int | None = None,
    kernel: str | None = None,
    sinks: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention with ``rotary``'s RoPE at ``remap``'s distances (module docstring).

    q (B, H, Lq, D) and k (B, Hk, Lk, D) unrotated; v (B, Hk, Lk, Dv); Hk divides H; Lq <= Lk, the queries
    being the last Lq of the keys' positions offset .. offset+Lk-1 (decoding with a cache of unrotated keys:
    every new query remaps every cached key anew). Length-dependent schedules (dynamic NTK, LongRoPE) use
    offset + Lk as the context. An unscaled rotary with ``max_position_embeddings`` (the trained length)
    refuses a remap that would still reach past it. ``sinks`` (H,): a learned logit per head added to every
    softmax row as a key with no value (attention sinks, as GPT-OSS has them). ``window``: sliding-window
    attention, each query taking only the keys at true distance < window (transformers' ``sliding_window``;
    token-distance remaps only). Returns (B, H, Lq, Dv).

    ``kernel``: "flash" (torch's CPU flash kernel on blocks of queries and key ranges, merged by their
    log-sum-exps: :mod:`posenc.kernels.remap_blocked`), "flex" (one FlexAttention call per view under a
    block mask, merged by their log-sum-exps: :mod:`posenc.kernels.remap_flex`; compiled on CUDA, forward
    only on the CPU) or "blocks" (each block of queries materialised under a checkpoint, any device);
    default "flash" on the CPU outside torch.compile, "flex" on CUDA, else "blocks".
    """
    if not isinstance(remap, Remap):
        raise ValueError(
            f"remap must be a posenc.remap.Remap (SelfExtend, ReRoPE, STRING, DualChunk), got {remap!r}"
        )
    offset = _checks.offset(offset)
    scale = None if scale is None else _checks.scale(scale)
    block = None if block is None else _checks.positive_int("block", block, size=True)
    sinks = None if sinks is None else check_sinks(sinks, q)
    kernel = _checked_kernel(kernel, q, k, v, sinks)
    if window is not None:
        window = _checks.positive_int("window", window, position=True)
    if q.shape[-2] == 0:
        return q.new_empty(*q.shape[:-1], v.shape[-1])
    qs, ks, bands = _rotated_views(q, k, rotary, remap, offset, window)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if kernel == "flash":
        return remap_attention_blocked(
            torch.stack(qs), torch.stack(ks), v, bands, scale=scale, block=block, sinks=sinks, offset=offset
        )
    if kernel == "flex":
        return remap_attention_flex(
            torch.stack(qs), torch.stack(ks), v, bands, scale=scale, sinks=sinks, offset=offset
        )
    fn = functools.partial(_views_block, bands=bands, dim=q.shape[-1], offset=offset)
    width = len(bands) + 4  # the scores, the weights, one view's scores and its band mask, per block
    params = () if sinks is None else (sinks,)
    return query_blocked_attention(
        fn,
        torch.cat(qs, -1),
        torch.cat(ks, -1),
        v,
        params,
        causal=True,
        scale=scale,
        width=width,
        block=block,
    )


def _rotated_views(q, k, rotary, remap: Remap, offset: int, window: int | None):
    """Per view of ``remap`` (clipped to ``window``), q and k rotated at its query and key positions (q
    times the remap's query scale), and the views' bands of distances."""
    lq, lk = q.shape[-2], k.shape[-2]
    if rotary is not None and rotary.scaling is None:  # a scaled schedule extends the trained length itself
        reach = offset + lk if window is None else min(offset + lk, window)
        remap.check_length(reach, rotary.max_position_embeddings)
    j = torch.arange(offset, offset + lk, device=q.device)
    i = j[lk - lq :]
    views = remap.views(i, j)
    if window is not None:
        views = views_within(views, window, remap)
    context = offset + lk
    qs, ks = [], []
    factor = remap.query_scale(i)
    for view in views:
        if rotary is None:
            qv, kv = q, k
        else:  # queries as queries, keys as keys (xPos scales them apart), about one centre per view
            centre = view_centre(view)
            qv = rotary.rotate_as(q, view.q, "q", context_len=context, centre=centre)
            kv = rotary.rotate_as(k, view.k, "k", context_len=context, centre=centre)
        if factor is not None:
            qv = qv * factor.to(qv.dtype)[:, None]
        qs.append(qv)
        ks.append(kv)
    return qs, ks, tuple(Band(w.lo, w.hi, w.unit) for w in views)


def view_centre(view: View) -> torch.Tensor:
    """The middle of a view's query and key positions, rounded up, as a (1,) tensor (read on no device):
    a pair's score only ever meets the queries and keys of one view, so each view may centre xPos's
    factors on its own positions, which keeps them small; for the true positions, the middle of the keys,
    as plain attention centres them."""
    low = torch.minimum(view.q.amin(), view.k.amin())
    high = torch.maximum(view.q.amax(), view.k.amax())
    return torch.ceil((low + high) / 2).reshape(1)
