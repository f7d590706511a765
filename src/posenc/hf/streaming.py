"""StreamingLLM in a transformers model (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
Sinks", arXiv:2309.17453): :func:`streaming_cache`.

The cache keeps the first ``sink_tokens`` tokens and the ``window`` most recent ones, as
:class:`posenc.StreamingKVCache` does for one layer, and the kept tokens take the positions 0 .. n-1 they hold
in the cache. It works on a model patched with ``patch_model(model, remap=...)``: there the cache holds
unrotated keys and the attention rotates them at every step, so after an eviction no key is rotated again
from an already rounded one. ``remap=posenc.remap.NoRemap()`` gives StreamingLLM itself; another remap
applies on the positions in the cache.
"""

from __future__ import annotations

import torch

from .. import _checks
from .remap import remap_state

__all__ = ["streaming_cache"]


def streaming_cache(model, sink_tokens: int = 4, window: int = 1020):
    """A transformers ``DynamicCache`` for ``model`` (patched with ``remap=``) that evicts every token but the
    first ``sink_tokens`` and the last ``window``; pass it as ``past_key_values`` to the model or to
    ``generate``. Each call may bring at most ``window`` new tokens (they must fit to attend to each other):
    feed a longer prompt in pieces. A one-layer model's logits at each step equal a fresh forward pass of
    the model as it was over the kept tokens (tested); deeper layers keep the hidden states each token had
    when it came, as StreamingLLM does."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if getattr(model, "posenc_remap_calls", None) is None:
        raise ValueError(
            "streaming_cache needs a model patched with posenc.hf.patch_model(model, remap=...) (remap="
            "posenc.remap.NoRemap() for StreamingLLM itself): its cache must hold unrotated keys"
        )
    calls = model.posenc_remap_calls
    sink_tokens = _checks.positive_int("sink_tokens", sink_tokens, minimum=0, size=True)
    window = _checks.positive_int("window", window, size=True)
    _check_fits(model, sink_tokens, window)

    class StreamingLayer(DynamicLayer):
        def __init__(self):
            super().__init__()
            self.seen = 0  # tokens given so far, kept or not: transformers counts positions by it

        def update(self, key_states, value_states, *args, **kwargs):
            new = key_states.shape[-2]
            if new > window:
                raise ValueError(
                    f"a streaming cache takes at most window={window} new tokens per call, got {new}: feed "
                    "the prompt in pieces"
                )
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            room = sink_tokens + window - new  # the old tokens that can stay
            if self.keys.numel() and self.keys.shape[-2] > room:
                cut = self.keys.shape[-2] - (room - sink_tokens)  # the recent tokens kept start here
                self.keys, self.values = (
                    torch.cat((t[..., :sink_tokens, :], t[..., cut:, :]), -2)
                    for t in (self.keys, self.values)
                )
            self.seen += new
            calls.streaming = True  # this forward's attention places the kept keys at 0 .. n-1
            return super().update(key_states, value_states)

        def get_seq_length(self) -> int:
            return self.seen

    class StreamingCache(DynamicCache):
        def __init__(self):
            super(DynamicCache, self).__init__(layer_class_to_replicate=StreamingLayer)

    return StreamingCache()


def _check_fits(model, sink_tokens: int, window: int) -> None:
    """Refuse a cache whose kept tokens, at cache positions 0 .. sink_tokens + window - 1, would meet
    (remapped) distances past the trained length of the patched rotary (an unscaled one that knows it)."""
    for module in model.modules():
        state = remap_state(module)
        if state is None:
            continue
        rotary, remap = state.rotary, state.remap
        trained = rotary.max_position_embeddings if rotary.scaling is None else None
        kept = sink_tokens + window
        if trained is not None and remap.distance(kept - 1) > trained - 1:
            low, high = 1, kept  # the most kept tokens the remap maps inside the trained length
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if remap.distance(mid - 1) <= trained - 1 else (low, mid)
            raise ValueError(
                f"sink_tokens={sink_tokens} + window={window} = {kept} kept tokens reach distance "
                f"{remap.distance(kept - 1):g} under {remap!r}, past the model's trained length "
                f"max_position_embeddings={trained}: sink_tokens + window must be <= {low}"
            )
        return
