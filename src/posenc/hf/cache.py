"""A transformers cache whose cached keys follow the current RoPE schedule: :func:`consistent_cache`."""

from __future__ import annotations

import torch

from ..rope import RotaryEmbedding
from ._config import rotary_from_config
from .handout import check_plain

__all__ = ["consistent_cache"]


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
