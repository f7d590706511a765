"""Additive attention-score biases: a bias adds b_h(i, j) to the score of query i and key j in head h."""

from .alibi import ALiBi, alibi_slopes
from .base import ScoreBias
from .fire import FireBias
from .kerple import KerpleBias
from .sandwich import SandwichBias
from .t5 import T5Bias, t5_relative_bucket

__all__ = [
    "ALiBi",
    "FireBias",
    "KerpleBias",
    "SandwichBias",
    "ScoreBias",
    "T5Bias",
    "alibi_slopes",
    "t5_relative_bucket",
]
