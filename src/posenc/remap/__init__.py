"""Training-free RoPE context extension by remapped distances: SelfExtend, ReRoPE (and leaky ReRoPE),
STRING, Dual Chunk Attention; :func:`remap_attention` runs any of them (``posenc.attention(...,
rotary=rope, remap=R)``)."""

from .base import NoRemap, Remap, View, remap_attention
from .dual_chunk import DualChunk
from .rerope import ReRoPE
from .selfextend import SelfExtend
from .string import STRING

__all__ = ["STRING", "DualChunk", "NoRemap", "ReRoPE", "Remap", "SelfExtend", "View", "remap_attention"]
