"""A transformers model with remapped-distance attention (:mod:`posenc.remap`): ``patch_model(model,
remap=R)``.

A remap scores each pair with queries and keys rotated at positions that depend on both (the query's
position decides which view a key falls in), so the rotation moves from the rotary module into the
attention: the model's rotary modules hand out the identity (cos 1, sin 0), q and k reach attention
unrotated, the KV cache keeps unrotated keys, and a registered attention function (``posenc_remap`` in
transformers' ``AttentionInterface``) runs :func:`posenc.attention` with the rotary and the remap. Every new
query remaps every cached key anew, so decoding equals the full forward pass.

The queries are the last of the keys, which start at position 0: unpadded batches only (a padded batch is
refused before the forward runs).
"""

from __future__ import annotations

import types

import torch

from ..attention import attention
from .layers import _attention_layers

__all__ = ["IMPLEMENTATION", "patch_remap", "unpatch_remap"]

IMPLEMENTATION = "posenc_remap"


def _identity_forward(module, x, position_ids, *args, **kwargs):
    shape = (*position_ids.shape, module.posenc_rotary.rotary_dim)
    return x.new_ones(shape), x.new_zeros(shape)


def _remap_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function protocol: q (B, H, Lq, D), k and v (B, Hk, Lk, D) from the cache;
    returns (B, Lq, H, Dv) and no weights."""
    state = getattr(module, "_posenc_remap", None)
    if state is None:
        raise ValueError(
            f"the attention implementation {IMPLEMENTATION!r} runs only in a model patched with "
            "posenc.hf.patch_model(model, remap=...)"
        )
    rotary, remap = state
    out = attention(query, key, value, rotary=rotary, remap=remap, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _refuse_padding(module, args, kwargs):
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()):
        raise ValueError(
            "a model patched with remap= takes unpadded batches only (its keys start at position 0); this "
            "attention_mask masks some tokens: run the sequences one at a time"
        )


def patch_remap(model, targets, rotary, remap) -> None:
    """Give the rotary modules ``targets`` the identity forward, every attention layer ``(rotary, remap)``,
    and the model the ``posenc_remap`` attention implementation (module docstring)."""
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, _remap_forward)
    for module in targets:
        module.posenc_rotary = rotary.to(next(iter(module.buffers()), torch.empty(0)).device)
        module.forward = types.MethodType(_identity_forward, module)
    layers = _attention_layers(model)
    if not layers:
        raise ValueError(f"patch_model(remap=) found no attention layer in {type(model).__name__}")
    for layer in layers:
        layer._posenc_remap = (rotary, remap)
    model._posenc_remap_saved = (
        model.config._attn_implementation,
        model.register_forward_pre_hook(_refuse_padding, with_kwargs=True),
    )
    model.config._attn_implementation = IMPLEMENTATION


def unpatch_remap(model) -> None:
    """Undo :func:`patch_remap`'s changes to the attention layers and the model (the rotary modules are
    restored by :func:`~posenc.hf.unpatch_model`)."""
    saved = getattr(model, "_posenc_remap_saved", None)
    if saved is None:
        return
    implementation, hook = saved
    model.config._attn_implementation = implementation
    hook.remove()
    del model._posenc_remap_saved
    for module in model.modules():
        if hasattr(module, "_posenc_remap"):
            del module._posenc_remap
