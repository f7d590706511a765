"""Additive attention-score biases: a bias adds b_h(i, j) to the score of query i and key j in head h."""

from .alibi import ALiBi, alibi_slopes
from .banded import BandedBias, BandedRelative, banded_attention, banded_bias
from .base import ScoreBias
from .content import ContentBias
from .cope import CoPE
from .fire import FireBias
from .forget import ForgetBias, ForgetGate, forgetting_attention
from .kerple import KerpleBias
from .sandwich import SandwichBias
from .shaw import ShawRelative
from .t5 import T5Bias, t5_relative_bucket

__all__ = [
    "ALiBi",
    "BandedBias",
    "BandedRelative",
    "CoPE",
    "ContentBias",
    "FireBias",
    "ForgetBias",
    "ForgetGate",
    "KerpleBias",
    "SandwichBias",
    "ScoreBias",
    "ShawRelative",
    "T5Bias",
    "alibi_slopes",
    "banded_attention",
    "banded_bias",
    "forgetting_attention",
    "t5_relative_bucket",
]
