"""A transformers model with remapped-distance attention (:mod:`posenc.remap`): ``patch_model(model,
remap=R)``.

A remap scores each pair with queries and keys rotated at positions that depend on both (the query's
position decides which view a key falls in), so the rotation moves from the rotary module into the
attention: the model's rotary module hands out the identity (cos 1, sin 0, in its own form), q and k reach
attention unrotated, the KV cache keeps unrotated keys, and a registered attention function
(``posenc_remap`` in transformers' ``AttentionInterface``) runs :func:`posenc.remap.remap_attention` with
the rotary and the remap. Every new query remaps every cached key anew, so decoding equals the full forward
pass. A layer's ``sliding_window`` limits it to the keys at true distance < window, and learned attention
sinks (``s_aux``: GPT-OSS and the families that copied it) join every softmax row, as in the model's own
attention. What the remap kernels cannot do (logit soft-capping, attention dropout, sinks given another
way) is refused, and so is a forward in which the model's attention never reached the registered function
(a family whose attention code does not go through the interface would otherwise run unrotated).

The keys are the positions up to the last query's (the position ids the rotary module is given: from 0
without a cache; a sliding-window cache keeps the tail): one consecutive run of positions for the whole
batch, unpadded. A padding mask is refused however it comes: to the model as a keyword or positionally
(before the forward runs), to an inner module (when transformers builds the layers' mask, through the mask
function registered with the attention function), or as a 4D mask of anything but causal attention within
the layer's window (at the first layer); packed position ids at the first layer.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field

import torch

from ..remap import remap_attention
from .layers import attention_layers
from .ledger import Ledger, use_attention

__all__ = ["IMPLEMENTATION", "RemapCalls", "RemapState", "patch_remap", "remap_state"]


@dataclass
class RemapCalls:
    """What one forward of a remapped model has learnt, shared by its rotary module and its layers: ``n``
    attention calls so far, the ``positions`` the rotary module was given, the ``last`` query's position
    (found at the first layer), whether a ``streaming`` cache placed the kept keys at 0 .. n-1, and the
    layer windows whose ``masks`` were checked."""

    n: int = 0
    positions: torch.Tensor | None = None
    last: int | None = None
    streaming: bool = False
    masks: set = field(default_factory=set)

    def new_forward(self) -> None:
        """Forget all of the last forward (a model's forward begins)."""
        self.n, self.positions = 0, None
        self.new_positions(None)

    def new_positions(self, positions) -> None:
        """A new pass of the rotary module with ``positions``: what was learnt about the old ones is stale."""
        self.positions, self.last, self.streaming = positions, None, False
        self.masks = set()


@dataclass(frozen=True)
class RemapState:
    """What an attention layer of a remapped model holds (its ``posenc_remap``): the ``rotary`` that
    rotates its queries and keys per view, the ``remap`` and the model's :class:`RemapCalls`."""

    rotary: object
    remap: object
    calls: RemapCalls


def remap_state(module) -> RemapState | None:
    """The :class:`RemapState` of an attention layer ``module`` of a model patched with ``remap=``; None for
    any other module."""
    return getattr(module, "posenc_remap", None)


IMPLEMENTATION = "posenc_remap"


def _remap_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kwargs
):
    """transformers' attention-function protocol: q (B, H, Lq, D), k and v (B, Hk, Lk, D) from the cache;
    returns (B, Lq, H, Dv) and no weights."""
    state = remap_state(module)
    if state is None:
        raise ValueError(
            f"the attention implementation {IMPLEMENTATION!r} runs only in a model patched with "
            "posenc.hf.patch_model(model, remap=...)"
        )
    rotary, remap, calls = state.rotary, state.remap, state.calls
    if kwargs.get("softcap") is not None:
        raise ValueError(f"remap= has no logit soft-capping; this layer passes softcap={kwargs['softcap']}")
    if dropout:
        raise ValueError(
            f"remap= has no attention dropout; this layer passes dropout={dropout} (model.eval(), or set "
            "the config's attention_dropout to 0 to train)"
        )
    if calls.streaming:  # set by posenc.hf.streaming_cache's update: the kept keys sit at 0 .. n-1
        offset = 0
    else:
        if calls.last is None:
            calls.last = _last_position(calls.positions, query.shape[-2], key.shape[-2])
        offset = calls.last + 1 - key.shape[-2]
        if offset < 0:
            raise ValueError(f"{key.shape[-2]} keys cannot end at position {calls.last}")
    if attention_mask is not None:
        _check_causal(attention_mask, calls, query.shape[-2], key.shape[-2], offset, sliding_window or None)
    sinks = kwargs.get("s_aux")
    if sinks is None and isinstance(getattr(module, "sinks", None), torch.Tensor):
        raise ValueError(f"{type(module).__name__} has sinks but does not pass them as s_aux")
    out = remap_attention(
        query,
        key,
        value,
        rotary,
        remap,
        offset=offset,
        scale=scaling,
        sinks=sinks,
        window=sliding_window or None,
    )
    calls.n += 1
    return out.transpose(1, 2).contiguous(), None


def _last_position(positions, q_len: int, k_len: int) -> int:
    """The position of the last query, from the position ids the rotary module was given (the keys are the
    last k_len positions up to it: the whole sequence, or a sliding-window cache's tail); refused unless
    every sequence's queries sit at consecutive positions, the same in each (one offset for the batch)."""
    if positions is None:
        return k_len - 1
    rows = positions.reshape(-1, positions.shape[-1])
    if rows.shape[-1] != q_len:
        raise ValueError(f"position_ids hold {rows.shape[-1]} positions for {q_len} queries")
    steps = torch.arange(q_len, device=rows.device)
    if not bool((rows == rows[:1, :1] + steps).all()):
        raise ValueError(
            "a model patched with remap= takes consecutive position_ids, one offset for the whole batch "
            "(not packed or per-sequence positions): run the sequences one at a time"
        )
    return int(rows[0, -1])


_PADDED = (
    "a model patched with remap= takes unpadded batches only (its keys start at position 0); this "
    "attention_mask masks some tokens: run the sequences one at a time"
)


def _refuse_padding(mask) -> None:
    """A ValueError if a (batch, keys) padding mask masks any token."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()):
        raise ValueError(_PADDED)


def _remap_mask(*args, attention_mask=None, **kwargs):
    """transformers' mask-function protocol for the ``posenc_remap`` implementation: the model's 2D padding
    mask (batch, keys) as bool, or None, however it reached the model; refused if it masks a token, and no
    mask is built (the remap kernels are causal within the layer's window themselves)."""
    _refuse_padding(attention_mask)
    return None


def _check_causal(mask: torch.Tensor, calls: RemapCalls, q_len: int, k_len: int, offset: int, window) -> None:
    """A ValueError unless a 4D mask (batch, 1 or heads, q_len, k_len), bool or additive, lets each query
    see exactly the keys at positions up to its own within ``window``, as the remap kernels do (a padding
    or custom mask reaching the attention without the model's mask function); checked once per forward and
    window, at the cost of reading the mask."""
    seen = calls.masks
    if window in seen:
        return
    if mask.dim() != 4 or tuple(mask.shape[-2:]) != (q_len, k_len):
        raise ValueError(
            f"a model patched with remap= takes no attention mask but the causal one; this one has shape "
            f"{tuple(mask.shape)} for {q_len} queries and {k_len} keys"
        )
    q_pos = torch.arange(offset + k_len - q_len, offset + k_len, device=mask.device)[:, None]
    k_pos = torch.arange(offset, offset + k_len, device=mask.device)[None]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= q_pos - k_pos < window
    if mask.dtype == torch.bool:
        same = bool((mask == allowed).all())
    else:  # additive: 0 where allowed, the dtype's lowest value (or -inf) where masked
        low = torch.finfo(mask.dtype).min
        same = bool(torch.where(allowed, mask == 0, mask <= low / 2).all())
    if not same:
        raise ValueError(
            "a model patched with remap= attends causally within each layer's window, unpadded; the "
            "attention mask its attention was given masks otherwise (padding, or a custom mask): run the "
            "sequences one at a time, without a mask"
        )
    seen.add(window)


def _before_forward(model, args, kwargs):
    try:  # the mask given to the model, by keyword or positionally
        given = inspect.signature(type(model).forward).bind_partial(model, *args, **kwargs).arguments
    except TypeError:  # the forward itself will say what is wrong with its arguments
        given = kwargs
    _refuse_padding(given.get("attention_mask"))
    model.posenc_remap_calls.new_forward()


def _after_forward(model, args, kwargs, output):
    if model.posenc_remap_calls.n == 0:
        raise ValueError(
            f"{type(model).__name__}'s attention did not go through transformers' attention interface, so "
            "patch_model(remap=) cannot reach it (its queries and keys went unrotated): this family cannot "
            "take a remap; posenc.hf.unpatch_model(model) restores it"
        )


def patch_remap(model, module, forward, rotary, remap, book: Ledger) -> None:
    """Give the rotary module ``module`` ``forward`` (its hand-out form) with the identity, every attention
    layer ``(rotary, remap)``, and the model the ``posenc_remap`` attention implementation (module
    docstring); every change into ``book``."""
    layers = attention_layers(model)
    if not layers:
        raise ValueError(f"patch_model(remap=) found no attention layer in {type(model).__name__}")
    book.set(module, "posenc_rotary", rotary.to(next(iter(module.buffers()), torch.empty(0)).device))
    # per forward: attention calls, the position ids the rotary module was given, the last query's position
    calls = RemapCalls()
    book.set(module, "posenc_identity", calls)
    book.set(module, "forward", types.MethodType(forward, module))
    for layer in layers:
        book.set(layer, "posenc_remap", RemapState(rotary, remap, calls))
    book.set(model, "posenc_remap_calls", calls)
    book.hook(model.register_forward_pre_hook(_before_forward, with_kwargs=True))
    book.hook(model.register_forward_hook(_after_forward, with_kwargs=True))
    # the model's mask construction calls _remap_mask with its padding mask, whichever module it was for
    use_attention(book, [model.config], IMPLEMENTATION, _remap_forward, _remap_mask)
