"""Additive attention-score biases: a bias adds b_h(i, j) to the score of query i and key j in head h."""

from .alibi import ALiBi, alibi_slopes

__all__ = ["ALiBi", "alibi_slopes"]
