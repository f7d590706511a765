"""A transformers model's forward with its sequence sharded over ranks: every attention layer on
:func:`posenc.parallel.ring_attention`.

Each rank runs the model on its shard of the tokens (:func:`posenc.parallel.shard_indices`) with
``position_ids`` the shard's global positions, so the model's own rotary embedding rotates q and k where
they sit in the whole sequence; the attention implementation ``posenc_ring`` then attends them around the
ring. Every mask is made by the ring from global indices, never by the model: a sliding-window layer
(Gemma 3, Mistral, GPT-OSS) keeps its window under context parallelism (the trap of a hook that
replaces each layer's mask with plain causal attention: accelerate#4177), and attention sinks (GPT-OSS's
``s_aux``) enter every row once.

What it refuses: before any work, a length-dependent RoPE (dynamic NTK: the model would take each rank's
own last position as the length) and attention logit soft-capping (Gemma 2); at the call, a padding mask
(pad with ``shard_indices(pad=True)`` instead) and attention dropout.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import torch

from ..parallel.ring import ring_attention
from .layers import attention_layers
from .ledger import Ledger, use_attention

__all__ = ["IMPLEMENTATION", "ContextParallel", "context_parallel"]

IMPLEMENTATION = "posenc_ring"


@dataclass(frozen=True)
class _Shard:
    indices: torch.Tensor
    document_ids: torch.Tensor | None
    group: object


_current: contextvars.ContextVar[_Shard | None] = contextvars.ContextVar("posenc_ring_shard", default=None)


def _no_mask(*args, **kwargs):
    """transformers' mask-function protocol: no mask at all; the ring masks from global indices."""
    return None


def _ring_forward(module, query, key, value, attention_mask, dropout=0.0, sliding_window=None, **kwargs):
    """transformers' attention-function protocol: q (B, H, n, D), k and v (B, Hk, n, D) of this rank's
    tokens, rotated by the model at their global positions; returns (B, n, H, Dv) and no weights."""
    shard = _current.get()
    if shard is None:
        raise ValueError(
            f"a model patched for context parallelism runs through its {ContextParallel.__name__} handle "
            "(cp(input_ids, indices)), which says which tokens this rank holds"
        )
    if dropout:
        raise ValueError(f"context parallelism takes no attention dropout, got {dropout}")
    if kwargs.get("softcap") is not None:
        raise ValueError(f"context parallelism does not apply logit soft-capping, got {kwargs['softcap']}")
    out = ring_attention(
        query,
        key,
        value,
        indices=shard.indices,
        group=shard.group,
        document_ids=shard.document_ids,
        causal=getattr(module, "is_causal", True),
        window=int(sliding_window) if sliding_window else None,
        scale=kwargs.get("scaling"),
        sinks=kwargs.get("s_aux"),
    )
    return out.transpose(1, 2).contiguous(), None


class ContextParallel:
    """The handle :func:`context_parallel` returns: call it with this rank's shard; :meth:`close` undoes
    the patch."""

    def __init__(self, model, group, book: Ledger):
        self.model, self.group, self._book = model, group, book

    def __call__(self, input_ids, indices, *, positions=None, document_ids=None, **kwargs):
        """The model's output for this rank's tokens.

        Args:
            input_ids: (batch, n) the tokens at ``indices`` (:func:`posenc.parallel.shard`; pad slots any
                token).
            indices: (n,) this rank's global token indices, -1 for pad slots.
            positions: (n,) or (batch, n) their positions (default the indices; packed documents:
                :func:`posenc.parallel.shard_positions` with ``cu_seqlens``).
            document_ids: (n,) a document id per token (packed documents attend within their own).
            kwargs: the model's other arguments; no attention_mask (refused), no cache.
        """
        if kwargs.get("attention_mask") is not None:
            raise ValueError(
                "context parallelism takes no attention_mask: pad with shard_indices(pad=True) (pad slots "
                "are masked) and pack documents with document_ids"
            )
        if positions is None:
            positions = indices.clamp(min=0)
        position_ids = positions if positions.dim() == 2 else positions[None].expand(input_ids.shape[0], -1)
        token = _current.set(_Shard(indices, document_ids, self.group))
        try:
            return self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **kwargs)
        finally:
            _current.reset(token)

    def close(self) -> None:
        """Put the model's attention implementation back."""
        self._book.undo()


def _length_dependent_rope(model) -> str | None:
    from ..rope.protocol import length_dependent
    from ._config import rotary_from_config

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    try:
        rotary = rotary_from_config(config)
    except ValueError:
        return None
    return type(rotary).__name__ if length_dependent(rotary) else None


def context_parallel(model, group=None) -> ContextParallel:
    """Patch ``model`` (a transformers causal LM on "sdpa" or "eager") so that each rank of ``group``
    (default the world) runs its forward on a shard of the sequence, attention on the ring (module
    docstring). Returns the handle to call with each rank's shard."""
    layers = attention_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no attention layers posenc recognises")
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError(
            f"this model soft-caps its attention logits (attn_logit_softcapping="
            f"{config.attn_logit_softcapping}); context parallelism does not apply soft-capping"
        )
    if _length_dependent_rope(model):
        raise ValueError(
            "this model's RoPE depends on the sequence length (dynamic scaling): each rank would take its "
            "own shard's last position as the length; context parallelism needs a fixed schedule"
        )
    book = Ledger()
    configs = {id(layer.config): layer.config for layer in layers if hasattr(layer, "config")}
    configs[id(model.config)] = model.config
    use_attention(book, configs.values(), IMPLEMENTATION, _ring_forward, _no_mask)
    return ContextParallel(model, group, book)
