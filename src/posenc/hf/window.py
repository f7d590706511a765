"""Sliding-window layers at O(L x window): the model's sliding attention on posenc's windowed kernel.

transformers gives a sliding-window layer (Gemma 3's ``layer_types`` "sliding_attention", window
``config.sliding_window``; Beltagy et al. 2020, "Longformer", arxiv.org/abs/2004.05150) a boolean
(batch, 1, Lq, Lk) mask once the keys reach the window: at 64K tokens 4G entries, before any score. Patched
by :func:`patch_windows`, the model's attention implementation becomes ``posenc_window``:

- its mask function leaves the sliding masks it can stand for unbuilt (None): causal, unpadded, the keys one
  run of positions ending at the last query (no cache, or a ``DynamicCache``, whose sliding layers keep the
  last window - 1 keys), built the ordinary way (no mask overlay, not under torch.compile's decoding); every
  other mask, the full layers' among them, is transformers' own ``sdpa_mask``;
- its attention function runs a sliding layer that got no mask, with at least ``window`` keys, on
  :func:`posenc.remap.remap_attention` (no remap, q and k as the model rotated them, ``window=``): each
  query takes the keys at distance < window, block by block of queries, so memory is O(L x window); every
  other call is transformers' own ``sdpa_attention_forward``, as the model ran it.

Only a model whose implementation is "sdpa" (transformers' default) is changed: eager attention returns its
weights, and the flash / flex implementations are windowed already.
"""

from __future__ import annotations

import torch

from ..remap import NoRemap, remap_attention
from .layers import attention_layers
from .ledger import Ledger, use_attention

__all__ = ["IMPLEMENTATION", "patch_windows"]

IMPLEMENTATION = "posenc_window"
_BASE = "sdpa"


def _windowed_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset=0,
    attention_mask=None,
    local_size=None,
    allow_is_causal_skip: bool = True,
    use_vmap: bool = False,
    **kwargs,
):
    """transformers' mask-function protocol: None for a sliding mask posenc's kernel stands for (module
    docstring), transformers' ``sdpa_mask`` for any other."""
    from transformers.masking_utils import prepare_padding_mask, sdpa_mask

    contiguous = (
        isinstance(q_offset, int)
        and isinstance(kv_offset, int)
        and kv_offset + kv_length == q_offset + q_length
    )
    if local_size is not None and kv_length >= local_size and allow_is_causal_skip and not use_vmap:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if contiguous and (padding is None or bool(padding.all())):
            return None
    return sdpa_mask(
        batch_size,
        q_length,
        kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        local_size=local_size,
        allow_is_causal_skip=allow_is_causal_skip,
        use_vmap=use_vmap,
        **kwargs,
    )


def _windowed_forward(module, query, key, value, attention_mask, dropout=0.0, sliding_window=None, **kwargs):
    """transformers' attention-function protocol: q (B, H, Lq, D), k and v (B, Hk, Lk, D); returns
    (B, Lq, H, Dv) and no weights."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    unmasked_window = sliding_window and attention_mask is None and key.shape[-2] >= sliding_window
    if not unmasked_window:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, **kwargs)
    if dropout or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        # what the kernel has not got: the mask the model would have built, and its own attention
        mask = _sliding_mask(query.shape[-2], key.shape[-2], sliding_window, query.device)
        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, **kwargs)
    out = remap_attention(
        query, key, value, None, NoRemap(), scale=kwargs.get("scaling"), window=int(sliding_window)
    )
    return out.transpose(1, 2).contiguous(), None


def _sliding_mask(q_len: int, k_len: int, window: int, device) -> torch.Tensor:
    """(1, 1, q_len, k_len) bool: query i (the last q_len of the keys' positions) takes key j iff
    0 <= i - j < window, as transformers' sliding_window_causal_mask_function."""
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None]
    return ((j <= i) & (i - j < window))[None, None]


def patch_windows(model, plan, book: Ledger) -> bool:
    """Run the sliding-window layers of ``model`` (its per-layer ``plan``) on posenc's windowed kernel
    (module docstring), every change into ``book``; True if the model was changed. A model without sliding
    layers, with chunked ones, with more than one window, or not on "sdpa" is left as it is."""
    kinds = {lp.attention for lp in plan}
    windows = {lp.window for lp in plan if lp.attention == "sliding"}
    if "sliding" not in kinds or "chunked" in kinds or len(windows) != 1:
        return False
    configs = {
        id(layer.config): layer.config for layer in attention_layers(model) if hasattr(layer, "config")
    }
    if not configs or any(c._attn_implementation != _BASE for c in configs.values()):
        return False
    use_attention(book, configs.values(), IMPLEMENTATION, _windowed_forward, _windowed_mask)
    return True
