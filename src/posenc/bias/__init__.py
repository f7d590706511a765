"""Additive attention-score biases: a bias adds b_h(i, j) to the score of query i and key j in head h."""

from .alibi import ALiBi, alibi_slopes
from .base import ScoreBias
from .content import ContentBias
from .cope import CoPE
from .fire import FireBias
from .kerple import KerpleBias
from .sandwich import SandwichBias
from .shaw import ShawRelative
from .t5 import T5Bias, t5_relative_bucket

__all__ = [
    "ALiBi",
    "CoPE",
    "ContentBias",
    "FireBias",
    "KerpleBias",
    "SandwichBias",
    "ScoreBias",
    "ShawRelative",
    "T5Bias",
    "alibi_slopes",
    "t5_relative_bucket",
]
