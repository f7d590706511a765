"""SelfExtend (Jin et al. 2024) against posenc.reference: distances, attention, gradients, decoding."""

import numpy as np
import pytest
import torch
from hypothesis import given

import posenc
from posenc import reference as R

from .cases import case, check_against_oracle, check_decoding, check_gradients


def test_distances_are_the_papers():
    d = R.selfextend_distance(10, 10, group_size=3, window=4)
    i, j = 9, 0  # beyond the window: 9 // 3 - 0 // 3 + 4 - 4 // 3
    assert d[i, j] == 3 - 0 + 4 - 1 and d[5, 2] == 3 and np.isnan(d[2, 5])
    assert d[8, 4] == 8 // 3 - 4 // 3 + 4 - 1  # d = 4 = W: grouped


@given(case())
def test_attention_is_the_oracles_in_float64(c):
    check_against_oracle(
        c, posenc.SelfExtend(group_size=3, window=5), lambda lq, lk, o: R.selfextend_distance(lq, lk, 3, 5, o)
    )


@given(case())
def test_attention_is_the_oracles_in_float32(c):
    check_against_oracle(
        c,
        posenc.SelfExtend(group_size=2, window=3),
        lambda lq, lk, o: R.selfextend_distance(lq, lk, 2, 3, o),
        dtype=torch.float32,
        tol=1e-5,
    )


def test_gradients():
    check_gradients(posenc.SelfExtend(group_size=2, window=4))


def test_decoding_with_unrotated_keys_is_the_full_pass():
    check_decoding(posenc.SelfExtend(group_size=4, window=6))


def test_a_window_covering_the_sequence_is_plain_rope():
    q, k, v = (torch.randn(1, 2, 20, 8, dtype=torch.float64) for _ in range(3))
    rope = posenc.RotaryEmbedding(8)
    torch.testing.assert_close(
        posenc.attention(q, k, v, rotary=rope, remap=posenc.SelfExtend(4, 20)),
        posenc.attention(q, k, v, rotary=rope),
    )


def test_bad_parameters_and_lengths_are_refused_by_name():
    with pytest.raises(ValueError, match="group_size must be an integer >= 1, got 0"):
        posenc.SelfExtend(0, 4)
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 2.5"):
        posenc.SelfExtend(2, 2.5)
    rope = posenc.RotaryEmbedding(8, max_position_embeddings=64)
    q = torch.randn(1, 1, 300, 8)
    with pytest.raises(
        ValueError,
        match=r"SelfExtend\(group_size=2, window=16\) maps 300 tokens to distances up to 157, past the "
        r"rotary's max_position_embeddings=64.*raise group_size",
    ):
        posenc.attention(q, q, q, rotary=rope, remap=posenc.SelfExtend(2, 16))
    posenc.attention(q, q, q, rotary=rope, remap=posenc.SelfExtend(8, 16))  # 299 // 8 + 14 = 51 fits
