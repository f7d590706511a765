"""transformers caches posenc builds: one whose cached keys follow the current RoPE schedule
(:func:`consistent_cache`), and a full-attention layer that keeps its keys in a reserved buffer and never
writes inside what it handed out (:func:`reserved_layer_class`: a prefix's questions restore it by
reference)."""

from __future__ import annotations

import functools

import torch

from ..rope import RotaryEmbedding
from ._config import rotary_from_config
from .handout import check_plain

__all__ = ["consistent_cache", "reserved_layer_class"]


def consistent_cache(model, rotary: RotaryEmbedding | None = None):
    """A transformers ``DynamicCache`` whose cached keys follow the current RoPE schedule.

    transformers caches keys rotated with the schedule of the step that produced them; with dynamic NTK,
    dynamic YaRN or LongRoPE that schedule changes as the sequence grows, and decoding drifts from a full
    forward pass. This cache, before appending a layer's new keys, turns the cached ones from the schedule
    they were rotated with to the one for the new total length (:func:`posenc.rope.cache.rerotate_schedule`):
    for a
    one-layer model, cached decoding then equals the full forward pass at every length (tested). Use it
    with a :func:`patch_model`-ed model (the schedules are then posenc's exactly)::

        patch_model(model)
        out = model(ids, cache=consistent_cache(model), use_cache=True)

    Batches must be unpadded (the total length is the cache length plus the new tokens). Half-precision keys
    are turned from float32 copies kept beside them, so they never drift from rounding again and again.
    """
    from transformers import DynamicCache

    from ..rope.cache import rerotate_schedule, same_schedule

    if rotary is not None:
        check_plain(rotary)  # the cached keys are rotated by the model's cos/sin, nothing else
    if rotary is None:
        found = [
            m.posenc_rotary
            for m in model.modules()
            if isinstance(getattr(m, "posenc_rotary", None), RotaryEmbedding)
        ]
        rotary = found[0] if found else rotary_from_config(model.config)

    class RopeConsistentCache(DynamicCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rotary = rotary
            self.schedules: dict[int, tuple] = {}
            # float32 copies of half-precision keys: turning them at every schedule change would round them
            # again each time, and they would drift
            self.precise: dict[int, torch.Tensor] = {}

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            cached = self.get_seq_length(layer_idx) if layer_idx < len(self.layers) else 0
            schedule = self.rotary.frequencies(cached + key_states.shape[-2])
            old = self.schedules.get(layer_idx)
            half = key_states.dtype in (torch.float16, torch.bfloat16)
            if cached and old is not None and not same_schedule(schedule, old):
                layer = self.layers[layer_idx]
                source = self.precise[layer_idx] if half else layer.keys
                turned = rerotate_schedule(source, old, schedule, self.rotary.layout)
                if half:
                    self.precise[layer_idx] = turned
                layer.keys = turned.to(layer.keys.dtype)
            self.schedules[layer_idx] = schedule
            if half:
                new = key_states.float()
                kept = self.precise.get(layer_idx)
                self.precise[layer_idx] = new if kept is None or not cached else torch.cat((kept, new), -2)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return RopeConsistentCache(config=model.config)


@functools.cache
def reserved_layer_class():
    """The cache layer :meth:`posenc.real.continuation.Continuation.prefill` gives each full-attention
    layer, a subclass of transformers' ``DynamicLayer`` (built on first use: transformers is imported only
    by what runs a real model)."""
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A full-attention cache layer whose keys and values live in a buffer of ``capacity`` tokens,
        (batch, kv_heads, capacity, head_dim); ``keys``/``values`` are views of its first tokens. A token is
        written after the view's end, never inside it, so a view handed out earlier keeps its contents."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity

        def update(self, key_states, value_states, *args, **kwargs):
            start = self.keys.shape[-2] if self.is_initialized else 0
            end = start + key_states.shape[-2]
            if not self.is_initialized or end > self.key_buffer.shape[-2]:
                self._allocate(key_states, value_states, max(end, self.capacity, 2 * start))
            self.key_buffer[..., start:end, :] = key_states
            self.value_buffer[..., start:end, :] = value_states
            self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
            return self.keys, self.values

        def _allocate(self, key_states, value_states, tokens: int) -> None:
            """A new buffer of ``tokens`` holding what is filled (the old one stays for any view of it)."""
            shape = tuple(key_states.shape[:-2])
            key_buffer = key_states.new_empty(shape + (tokens, key_states.shape[-1]))
            value_buffer = value_states.new_empty(shape + (tokens, value_states.shape[-1]))
            if self.is_initialized:
                key_buffer[..., : self.keys.shape[-2], :] = self.keys
                value_buffer[..., : self.values.shape[-2], :] = self.values
            self.key_buffer, self.value_buffer = key_buffer, value_buffer
            self.device, self.is_initialized = key_states.device, True

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("a reserved cache layer serves the questions of one sequence")

        batch_select_indices = batch_repeat_interleave

    ReservedLayer.__module__ = __name__
    return ReservedLayer
