"""ReRoPE and leaky ReRoPE (Su 2023) against posenc.reference: distances, attention, log-n scaling,
gradients, decoding."""

import numpy as np
import pytest
import torch
from hypothesis import given

import posenc
from posenc import reference as R

from .cases import case, check_against_oracle, check_decoding, check_gradients


def test_distances_are_the_papers():
    d = R.rerope_distance(12, 12, window=4)
    assert d[11, 0] == 4 and d[6, 3] == 3 and np.isnan(d[3, 6])
    leaky = R.rerope_distance(12, 12, window=4, leaky=2.0)
    assert leaky[11, 0] == 4 + (11 - 4) / 2 and leaky[6, 3] == 3


@given(case())
def test_attention_is_the_oracles_in_float64(c):
    check_against_oracle(c, posenc.ReRoPE(window=5), lambda lq, lk, o: R.rerope_distance(lq, lk, 5, offset=o))


@given(case())
def test_leaky_attention_with_log_n_scaling_is_the_oracles(c):
    remap = posenc.ReRoPE(window=4, leaky=3.0, log_n_length=8)
    check_against_oracle(c, remap, lambda lq, lk, o: R.rerope_distance(lq, lk, 4, 3.0, o))


@given(case())
def test_attention_is_the_oracles_in_float32(c):
    remap = posenc.ReRoPE(window=3, leaky=2.0)
    check_against_oracle(
        c, remap, lambda lq, lk, o: R.rerope_distance(lq, lk, 3, 2.0, o), torch.float32, 1e-5
    )


def test_log_n_scaling_is_the_released_codes():
    i = torch.arange(0, 40)
    scale = posenc.ReRoPE(4, log_n_length=16).query_scale(i)
    want = np.clip(np.log(np.arange(40) + 1) / np.log(16), 1, None)
    np.testing.assert_allclose(scale.numpy(), want, rtol=1e-15)


def test_gradients():
    check_gradients(posenc.ReRoPE(window=4))
    check_gradients(posenc.ReRoPE(window=3, leaky=2.0, log_n_length=4))


def test_decoding_with_unrotated_keys_is_the_full_pass():
    check_decoding(posenc.ReRoPE(window=5, leaky=4.0))


def test_bad_parameters_are_refused_by_name():
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        posenc.ReRoPE(0)
    with pytest.raises(ValueError, match="leaky must be > 1, got 1"):
        posenc.ReRoPE(4, leaky=1)
    with pytest.raises(ValueError, match="log_n_length must be an integer >= 2, got 1"):
        posenc.ReRoPE(4, log_n_length=1)
