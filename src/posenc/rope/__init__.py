"""Rotary position embedding (RoPE; Su et al. 2021, arxiv.org/abs/2104.09864) and everything around it.

- :mod:`.frequencies`: the frequency schedule of every context-extension method, and its registry;
- :mod:`.table`: cos/sin tables for positions, read through one lookup;
- :mod:`.base`: :class:`Rotary`, the base of every rotary module: one dispatch (``forward``, ``rotate``)
  over one hook, ``tables(x, positions, offset, ...) -> (cos, sin)``;
- :mod:`.embedding`: :class:`RotaryEmbedding`, the module that rotates queries and keys;
- :mod:`.checks`: the argument checks the rotary modules share;
- :mod:`.cache_hooks`: what a KV cache asks of a rotary embedding besides rotating;
- :mod:`.protocol`: :class:`RotaryProtocol`, what every rotary embedding offers ``posenc.attention``;
- :mod:`.layout`: moving weights between pair layouts and keys between positions;
- :mod:`.cache`: a KV cache that keeps length-dependent schedules consistent while decoding;
- :mod:`.streaming`: StreamingLLM's cache, attention-sink tokens and a recent window at cache positions;
- :mod:`.packing`: each token's position in its own document, for packed sequences;
- :mod:`.mrope`: multimodal RoPE (Qwen2-VL, Qwen3-VL) and its (time, height, width) positions;
- :mod:`.axial`: RoPE on image and video grids, axial or RoPE-Mixed;
- :mod:`.xpos`: xPos (RoPE with a per-pair decay) and the blockwise causal mask;
- :mod:`.fope`: FoPE (Fourier series per pair, frequencies below the training length's floor clipped).
"""

from .axial import AxialRotaryEmbedding
from .base import Rotary
from .cache import RotaryKVCache, rerotate_keys
from .embedding import RotaryEmbedding
from .fope import FoPE
from .frequencies import rope_frequencies
from .layout import convert_layout
from .mrope import MRotaryEmbedding, mrope_positions
from .packing import packed_positions
from .protocol import RotaryProtocol
from .streaming import StreamingKVCache
from .xpos import XPos, blockwise_causal_mask

__all__ = [
    "AxialRotaryEmbedding",
    "FoPE",
    "MRotaryEmbedding",
    "Rotary",
    "RotaryEmbedding",
    "RotaryKVCache",
    "RotaryProtocol",
    "StreamingKVCache",
    "XPos",
    "blockwise_causal_mask",
    "convert_layout",
    "mrope_positions",
    "packed_positions",
    "rerotate_keys",
    "rope_frequencies",
]
