"""Attention for a batch of questions over one shared prefix: the prefix's keys are read once for every row.

A trial's questions continue the same long prefix. Decoding them one at a time reads the prefix's keys and
values once per question and decoded token, and that read is most of a step's cost at 8K tokens and more.
Here the rows of one batch are questions, each at its own positions after the prefix (a shorter question is
padded on the right, its padding never seen); the cache of the batch holds only the rows' own tokens (rows x
tokens), and the attention
implementation ``posenc_shared_prefix`` scores each query against the prefix's keys, held once (batch 1),
and against its own row's suffix, in one softmax over both. The queries of all rows and all query heads of
a key head are one matrix against that key head's prefix keys, so the prefix is read once per step for the
whole batch, as cascade attention does (Juravsky et al. 2024, Hydragen, arXiv:2402.05099; FlashInfer's
cascade kernels).

The scores are the model's own: its queries and keys as the model's attention received them, its
``scaling``, its sliding window by true distance; a model patched with ``remap=`` (:mod:`posenc.hf.remap`)
scores every pair in the view its distance falls in, as :func:`posenc.remap.remap_attention` does, with
the queries and keys rotated per view. Exact in arithmetic; in floating point the sums run in another order
than the model's own kernel.

What it cannot score that way is not batched (:func:`can_share`): another attention implementation, logit
soft-capping, attention sinks, attention dropout; and it runs on torch's CPU flash kernel, in float32 or
float64, so a model on another device or in half precision answers one question at a time.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .ledger import Ledger, use_attention
from .remap import remap_state

__all__ = ["IMPLEMENTATION", "Prefix", "Rows", "can_share", "length_dependent_positions", "shared_prefix"]

IMPLEMENTATION = "posenc_shared_prefix"
# the implementations whose scores this reproduces: softmax(q k^T * scaling), masked causally within the
# layer's window; posenc's remap adds its views
_PLAIN = ("sdpa", "eager")
_REMAP = "posenc_remap"
_MASKED = -1e30


@dataclass(frozen=True)
class Prefix:
    """The shared prefix: per cache layer its ``keys`` and ``values`` (1, kv_heads, n, head_dim), the
    last n of its ``length`` tokens (all of them for a full-attention layer, the tail a sliding-window layer
    keeps)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int


@dataclass
class Rows:
    """Where the rows of a batch are, set by the caller before each forward: ``queries`` (B, q) the positions
    of the tokens it feeds, ``positions`` (B, s) those of every token of each row's own cache, the fed ones
    last, and ``valid`` (B, s) which of them a row holds (not padding)."""

    queries: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices), as the cache keeps them."""
        self.queries, self.positions, self.valid = self.queries[rows], self.positions[rows], self.valid[rows]


@dataclass(frozen=True)
class _Shared:
    """What the forward calls inside :func:`shared_prefix` read: the prefix, whether the model is remapped,
    and per layer the prefix's keys as each view rotated them (the keys' positions, the rotated keys), kept
    from step to step where the rotation depends on the positions alone."""

    prefix: Prefix
    rows: Rows
    remapped: bool
    rotated: dict = field(default_factory=dict)


_current: contextvars.ContextVar[_Shared | None] = contextvars.ContextVar(
    "posenc_shared_prefix", default=None
)


def can_share(model) -> str | None:
    """None when the batches of :func:`shared_prefix` reproduce ``model``'s attention; else why not."""
    weight = next(model.parameters(), None)
    if weight is not None and weight.device.type != "cpu":
        return f"a model on {weight.device} (the batches run on torch's CPU flash kernel)"
    if weight is not None and weight.dtype not in (torch.float32, torch.float64):
        return f"a model in {weight.dtype} (the batches compute in float32 or float64)"
    config = model.config
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in (*_PLAIN, _REMAP):
        return f"attention implementation {implementation!r} (shared: {', '.join((*_PLAIN, _REMAP))})"
    for name in ("attn_logit_softcapping", "attention_logit_softcapping"):
        if getattr(config, name, None) is not None:
            return f"logit soft-capping ({name}={getattr(config, name)})"
    if any(isinstance(getattr(m, "sinks", None), torch.Tensor) for m in model.modules()):
        return "attention sinks"
    return None


def length_dependent_positions(model) -> bool:
    """Whether ``model``'s rotary schedule depends on the length of the call (dynamic NTK, LongRoPE): its
    rows are then batched only with rows at the same positions, since the schedule of a call is taken at its
    longest row (as transformers does) and a shorter row alone would see another. Read from posenc's
    rotaries where the model is patched (:func:`posenc.rope.protocol.length_dependent`), else from
    transformers' rotary modules' rope types, as posenc's registry of them declares each
    (:data:`posenc.rope.frequencies.ROPE_TYPES`; an unknown one counts as dependent)."""
    from ..rope.frequencies import ROPE_TYPES
    from ..rope.protocol import length_dependent

    for module in model.modules():
        rotary = getattr(module, "posenc_rotary", None)
        state = getattr(module, "_posenc_state", None)
        if rotary is not None:
            if length_dependent(rotary):
                return True
        elif state is not None:
            if any(lp.rope is not None and length_dependent(lp.rope.module()) for lp in state.plan):
                return True
        else:
            kinds = getattr(module, "rope_type", None)
            kinds = kinds.values() if isinstance(kinds, dict) else [] if kinds is None else [kinds]
            if any(kind not in ROPE_TYPES or ROPE_TYPES[kind].length_dependent for kind in kinds):
                return True
    return False


@contextlib.contextmanager
def shared_prefix(model, prefix: Prefix, rows: Rows) -> Iterator[None]:
    """Within it, ``model``'s forward calls attend over ``prefix`` and their own cache, which holds only the
    rows' tokens after it, where ``rows`` says they are (the module docstring); the model's attention
    implementation is put back after."""
    why = can_share(model)
    if why is not None:
        raise ValueError(f"questions cannot share a prefix in one batch on this model: {why}")
    token = _current.set(_Shared(prefix, rows, remapped=model.config._attn_implementation == _REMAP))
    book = Ledger()
    use_attention(book, [model.config], IMPLEMENTATION, _shared_forward, _no_mask)
    try:
        yield
    finally:
        book.undo()
        _current.reset(token)


def _no_mask(*args, **kwargs):
    """transformers' mask-function protocol: no mask; the positions decide what each query sees."""
    return None


def _shared_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kwargs
):
    """transformers' attention-function protocol: q (B, H, q, D) of the rows' newest tokens, k and v
    (B, Hk, s, D) every token of the rows after the prefix; returns (B, q, H, Dv) and no weights."""
    shared = _current.get()
    if shared is None:
        raise ValueError(f"the attention implementation {IMPLEMENTATION!r} runs only inside shared_prefix()")
    if dropout:
        raise ValueError(f"a shared prefix takes no attention dropout, got {dropout}")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("a shared prefix scores without logit soft-capping and attention sinks")
    if shared.remapped:
        state = remap_state(module)
        rotary, remap = state.rotary, state.remap
        state.calls.n += 1  # the remap patch checks that its layers' attention ran
    else:
        from ..remap import NoRemap

        rotary, remap = None, NoRemap()
    prefix = shared.prefix
    layer = module.layer_idx
    scale = 1.0 / math.sqrt(query.shape[-1]) if scaling is None else scaling
    window = sliding_window or None
    memo = shared.rotated.setdefault(layer, {}) if _position_only(rotary) else None
    rows = shared.rows
    if rows.positions.shape != key.shape[::2][:2] or rows.queries.shape != query.shape[::2][:2]:
        raise ValueError(
            f"the rows' positions {tuple(rows.queries.shape)} and {tuple(rows.positions.shape)} do not match "
            f"their queries {tuple(query.shape)} and keys {tuple(key.shape)}"
        )
    keys = _Keys(prefix.keys[layer], prefix.values[layer], key, value, prefix.length, rows, memo)
    out = _attend(query, keys, rows.queries, rotary, remap, scale, window)
    return out.transpose(1, 2).contiguous(), None


@dataclass(frozen=True)
class _Keys:
    """A layer's keys: the prefix's (1, Hk, n, D), the last n of its ``length`` tokens, then the rows' own
    (B, Hk, s, D) where ``rows`` puts them."""

    prefix_k: torch.Tensor
    prefix_v: torch.Tensor
    own_k: torch.Tensor
    own_v: torch.Tensor
    length: int
    rows: Rows
    memo: dict | None = None  # view -> (positions, prefix keys rotated at them), when they can be kept

    def prefix_positions(self) -> torch.Tensor:
        n = self.prefix_k.shape[-2]
        return torch.arange(self.length - n, self.length, device=self.own_k.device)


def _attend(query, keys: _Keys, at: torch.Tensor, rotary, remap, scale: float, window) -> torch.Tensor:
    """Queries (B, H, q, D), row b's at positions ``at[b]`` (B, q), over ``keys``: each pair scored in its
    view of ``remap`` (one view, the true distance, without a remap), masked causally within ``window``;
    (B, H, q, Dv). The rows' own keys are few: their scores are formed, padding masked. The prefix goes
    through torch's CPU flash kernel in the parts of :mod:`posenc.kernels.remap_blocked` (each band's
    mask-free middle for every query of the batch, its edges under a mask), every row and query head of a
    key head as one block of queries, and the parts are merged by their log-sum-exps."""
    from ..kernels.blocked_common import flash
    from ..kernels.remap_blocked import Band, band_parts

    b, h, q, _ = query.shape
    hk, n = keys.prefix_k.shape[1], keys.prefix_k.shape[-2]
    g = h // hk
    i = at.reshape(-1)
    j = keys.prefix_positions()
    on_prefix, on_own = _views(remap, i, j, keys.rows.positions.reshape(-1), window)
    bands = tuple(Band(v.lo, v.hi, v.unit) for v in on_prefix)
    qs, prefix_ks, own_ks = _rotated(query, keys, on_prefix, on_own, rotary, remap, at, window)
    # finite: a padding query may see no key at all, and must not turn its row's values into NaN
    own = query.new_full((b, hk, g, q, keys.own_k.shape[-2]), _MASKED)
    for band, qv, ko in zip(bands, qs, own_ks, strict=True):
        s = torch.matmul(qv.view(b, hk, g, q, -1), ko.unsqueeze(2).transpose(-1, -2)).mul_(scale)
        inside = band.inside(at, keys.rows.positions)
        own = torch.where((inside & keys.rows.valid[:, None]).view(b, 1, 1, q, -1), s, own)
    lse = torch.logsumexp(own, dim=-1)
    out = torch.matmul(torch.softmax(own, dim=-1), keys.own_v.unsqueeze(2))  # (B, Hk, G, q, Dv)
    for view, j0, j1, edge in band_parts(int(i.min()), int(i.max()) + 1, n, bands, keys.length - n):
        mask = None
        if edge:  # (B, q, keys) as (B * G * q, keys), the order of the block of queries
            inside = bands[view].inside(i, j[j0:j1]).view(b, 1, q, -1).expand(b, g, q, -1)
            mask = torch.zeros(inside.shape, dtype=query.dtype, device=query.device).masked_fill_(
                ~inside, _MASKED
            )
            mask = mask.reshape(1, 1, b * g * q, -1)
        block = qs[view].view(b, hk, g, q, -1).transpose(0, 1).reshape(1, hk, b * g * q, -1)
        o, l_part = flash(
            block, prefix_ks[view][:, :, j0:j1], keys.prefix_v[:, :, j0:j1], attn_mask=mask, scale=scale
        )[:2]
        o = o.view(hk, b, g, q, -1).transpose(0, 1)
        l_part = l_part.view(hk, b, g, q).transpose(0, 1).to(lse.dtype)
        # two normalised partial softmaxes merged: the new part's weight is sigmoid(l_part - lse)
        out = torch.lerp(out, o.to(out.dtype), torch.sigmoid(l_part - lse)[..., None])
        lse = torch.logaddexp(lse, l_part)
    return out.reshape(b, h, q, -1)


def _views(remap, i: torch.Tensor, prefix: torch.Tensor, own: torch.Tensor, window):
    """``remap``'s views for the queries at ``i`` against the prefix's keys and against the rows' own keys
    (positions flattened: the views are elementwise in them), limited to ``window``."""
    from ..remap.base import views_within

    views = remap.views(i, prefix), remap.views(i, own)
    if window is not None:
        views = tuple(views_within(v, window, remap) for v in views)
    if [(v.lo, v.hi, v.unit) for v in views[0]] != [(v.lo, v.hi, v.unit) for v in views[1]]:
        raise ValueError(f"{remap!r} gave other bands for the prefix's keys than for the rows' own")
    return views


def _position_only(rotary) -> bool:
    """Whether ``rotary`` rotates a key by its position alone (plain RoPE at a fixed schedule: no length
    dependence, no xPos scale about a centre), so that the prefix's rotated keys hold from step to step."""
    from ..rope import RotaryEmbedding
    from ..rope.protocol import length_dependent

    return type(rotary) is RotaryEmbedding and not length_dependent(rotary)


def _prefix_rotated(keys: _Keys, rotary, view: int, positions, context: int, centre) -> torch.Tensor:
    """The prefix's keys rotated at ``positions`` for view number ``view``: from the memo when it holds
    them at the same positions."""
    if keys.memo is not None:
        kept = keys.memo.get(view)
        if kept is not None and torch.equal(kept[0], positions):
            return kept[1]
    rotated = rotary.rotate_as(keys.prefix_k, positions, "k", context_len=context, centre=centre)
    if keys.memo is not None:
        keys.memo[view] = (positions, rotated)
    return rotated


def _rotated(query, keys: _Keys, on_prefix, on_own, rotary, remap, at: torch.Tensor, window):
    """Per view: the queries, the prefix's keys and the rows' own keys rotated at its positions (the queries
    times the remap's query scale); as they are without a rotary. ``at``: the queries' positions (B, q)."""
    from ..remap.base import view_centre

    b, q = at.shape
    context = int(at.max()) + 1  # the rows share one schedule: see length_dependent_positions
    if rotary is not None and rotary.scaling is None:  # a scaled schedule extends the trained length itself
        reach = context if window is None else min(context, window)
        remap.check_length(reach, rotary.max_position_embeddings)
    factor = remap.query_scale(at.reshape(-1))
    qs, prefix_ks, own_ks = [], [], []
    for view, mine in zip(on_prefix, on_own, strict=True):
        qv, kp, ko = query, keys.prefix_k, keys.own_k
        if rotary is not None:
            centre = view_centre(view)
            qv = rotary.rotate_as(qv, view.q.view(b, q), "q", context_len=context, centre=centre)
            kp = _prefix_rotated(keys, rotary, len(qs), view.k, context, centre)
            ko = rotary.rotate_as(ko, mine.k.view(b, -1), "k", context_len=context, centre=centre)
        if factor is not None:
            qv = qv * factor.to(qv.dtype).view(b, 1, q, 1)
        qs.append(qv)
        prefix_ks.append(kp)
        own_ks.append(ko)
    return qs, prefix_ks, own_ks
