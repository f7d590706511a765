"""posenc: positional encodings for PyTorch transformers.

Sinusoidal, learned, rotary (RoPE, with every context-extension method) and ALiBi encodings, a numpy
reference for each (:mod:`posenc.reference`), one attention entry point, and a laboratory
(:mod:`posenc.lab`) that trains small GPTs with each and measures how they extrapolate.
"""

import importlib

from ._checks import PositionError
from .absolute import LearnedEmbedding, NoPositionalEncoding, SinusoidalEncoding
from .attention import attention
from .bias import (
    ALiBi,
    BandedBias,
    BandedRelative,
    ContentBias,
    CoPE,
    FireBias,
    ForgetBias,
    ForgetGate,
    KerpleBias,
    SandwichBias,
    ScoreBias,
    ShawRelative,
    T5Bias,
    alibi_slopes,
    banded_attention,
    forgetting_attention,
)
from .remap import STRING, DualChunk, ReRoPE, SelfExtend
from .rope import (
    AxialRotaryEmbedding,
    FoPE,
    MRotaryEmbedding,
    RotaryEmbedding,
    RotaryKVCache,
    RotaryProtocol,
    StreamingKVCache,
    XPos,
    blockwise_causal_mask,
    convert_layout,
    packed_positions,
    rerotate_keys,
    rope_frequencies,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    # The numpy oracle is for tests, the tour and readers; the library itself never imports it.
    if name == "reference":
        return importlib.import_module(".reference", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALiBi",
    "AxialRotaryEmbedding",
    "BandedBias",
    "BandedRelative",
    "CoPE",
    "ContentBias",
    "DualChunk",
    "FireBias",
    "FoPE",
    "ForgetBias",
    "ForgetGate",
    "KerpleBias",
    "LearnedEmbedding",
    "MRotaryEmbedding",
    "NoPositionalEncoding",
    "PositionError",
    "ReRoPE",
    "RotaryEmbedding",
    "STRING",
    "SandwichBias",
    "SelfExtend",
    "ScoreBias",
    "ShawRelative",
    "SinusoidalEncoding",
    "T5Bias",
    "XPos",
    "alibi_slopes",
    "attention",
    "banded_attention",
    "blockwise_causal_mask",
    "forgetting_attention",
    "reference",
    "rope_frequencies",
    "convert_layout",
    "packed_positions",
    "rerotate_keys",
    "RotaryKVCache",
    "RotaryProtocol",
    "StreamingKVCache",
]
