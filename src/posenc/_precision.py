"""Buffers that keep their precision when a model is cast to half precision.

``model.half()`` or ``model.to(torch.bfloat16)`` casts every floating buffer. A buffer holding frequencies,
slopes or sinusoid rates in float32 or float64 is then rounded to 8 or 11 bits, and every bias or angle
computed from it is off by far more than the input's rounding: a SandwichBias cast to bfloat16 was off by
up to 6.2. RoPE keeps its angles out of buffers for this reason; modules that keep such buffers list them in
``precise_buffers``, and only their device follows a cast.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["KeepsPrecision"]


class KeepsPrecision(nn.Module):
    """An ``nn.Module`` whose buffers named in ``precise_buffers`` keep their dtype through ``.half()``,
    ``.bfloat16()``, ``.to(dtype)``; ``.to(device)`` and ``.cuda()`` still move them."""

    precise_buffers: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        held = {n: self._buffers.pop(n) for n in self.precise_buffers if self._buffers.get(n) is not None}
        try:
            return super()._apply(fn, recurse)
        finally:
            for name, buf in held.items():
                # where the cast sends a floating tensor on this device: the device, never the dtype
                where = fn(torch.empty(0, device=buf.device, dtype=torch.float32)).device
                self._buffers[name] = buf.to(where)
