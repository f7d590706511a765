"""What ``posenc bench`` measures on each device: shapes, dtypes, lengths and repetitions."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Preset:
    """One device's benchmark sizes.

    rope_shapes: q's (batch, heads, seq, head_dim); k has heads / kv_group heads (GQA when kv_group > 1).
    rope_backward: also time forward + backward through autograd.
    lengths: ALiBi attention sequence lengths, at batch 1 with ``heads`` heads of ``head_dim``.
    bias_lengths: the score-bias benchmark's lengths (``--only bias``); bias_default_lengths: those a
    plain ``posenc bench`` runs it at (every bias in both modes is a fresh process per length, so the
    default run keeps to a short one and the long lengths come with ``--only bias``).
    """

    rope_shapes: tuple[tuple[int, int, int, int], ...]
    dtypes: tuple[torch.dtype, ...]
    rope_repeat: int
    lengths: tuple[int, ...]
    attention_dtype: torch.dtype
    attention_repeat: int
    kv_group: int = 1
    rope_backward: bool = False
    heads: int = 8
    head_dim: int = 64
    bias_lengths: tuple[int, ...] = (2048, 8192, 16384)
    bias_default_lengths: tuple[int, ...] = (2048,)


_BOTH = (torch.float32, torch.bfloat16)
_CPU_FULL_SHAPES = ((4, 16, 2048, 128), (1, 32, 8192, 128))

PRESETS: dict[tuple[str, bool], Preset] = {
    ("cpu", False): Preset(_CPU_FULL_SHAPES, _BOTH, 11, (2048, 8192, 16384), torch.float32, 3),
    # --quick leaves the biases out of the default run (a dozen fresh processes); --only bias runs them
    ("cpu", True): Preset(
        ((1, 2, 64, 32),),
        _BOTH,
        3,
        (256, 1024),
        torch.float32,
        2,
        bias_lengths=(512,),
        bias_default_lengths=(),
    ),
    ("cuda", False): Preset(
        (*_CPU_FULL_SHAPES, (8, 32, 4096, 128)),
        _BOTH,
        20,
        (2048, 8192, 16384, 65536),
        torch.bfloat16,
        5,
        kv_group=4,
        rope_backward=True,
        bias_default_lengths=(2048, 8192, 16384),
    ),
    ("cuda", True): Preset(
        ((1, 4, 16, 32),),
        (torch.float32,),
        2,
        (128,),
        torch.bfloat16,
        2,
        kv_group=4,
        rope_backward=True,
        bias_lengths=(128,),
        bias_default_lengths=(128,),
    ),
}
"""(device type, quick) -> what to run. ``--quick`` is a smoke test of the machinery: tiny shapes."""


def preset(device: torch.device, quick: bool) -> Preset:
    """The preset for ``device``'s type (CPU or CUDA) and ``quick``."""
    return PRESETS[(device.type, bool(quick))]
