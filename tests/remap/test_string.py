"""STRING (An et al. 2024) against posenc.reference: distances, attention, gradients, decoding."""

import numpy as np
import pytest
import torch
from hypothesis import given

import posenc
from posenc import reference as R

from .cases import case, check_against_oracle, check_decoding, check_gradients


def test_distances_are_the_papers():
    d = R.string_distance(12, 12, shift=6, local_window=2)
    assert d[11, 0] == 11 - 6 + 2 and d[7, 2] == 5 and d[8, 2] == 2 and np.isnan(d[2, 7])


@given(case())
def test_attention_is_the_oracles_in_float64(c):
    check_against_oracle(
        c, posenc.STRING(shift=7, local_window=3), lambda lq, lk, o: R.string_distance(lq, lk, 7, 3, o)
    )


@given(case())
def test_the_released_codes_attention_factor_scales_every_score_by_its_square(c):
    factor = 1.0 + 0.1 * np.log(2)
    remap = posenc.STRING(shift=6, local_window=2, attention_factor=factor)
    # cos and sin times a, on queries and keys alike: every score times a^2, as a query scale
    assert torch.equal(remap.query_scale(torch.arange(5)), torch.full((5,), factor**2, dtype=torch.float64))
    check_against_oracle(c, remap, lambda lq, lk, o: R.string_distance(lq, lk, 6, 2, o))


@given(case())
def test_attention_is_the_oracles_in_float32(c):
    remap = posenc.STRING(shift=5, local_window=2)
    check_against_oracle(c, remap, lambda lq, lk, o: R.string_distance(lq, lk, 5, 2, o), torch.float32, 1e-5)


def test_gradients():
    check_gradients(posenc.STRING(shift=5, local_window=2))


def test_decoding_with_unrotated_keys_is_the_full_pass():
    check_decoding(posenc.STRING(shift=9, local_window=3))


def test_bad_parameters_are_refused_by_name():
    with pytest.raises(ValueError, match="local_window must be <= shift"):
        posenc.STRING(4, 8)
    with pytest.raises(ValueError, match="shift must be an integer >= 1, got -1"):
        posenc.STRING(-1, 1)
