"""ALiBi module against posenc.reference."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import ALiBi, alibi_slopes
from posenc import reference as R


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 16, 20, 32])
def test_slopes_match_reference(n):
    np.testing.assert_allclose(alibi_slopes(n).numpy(), R.alibi_slopes(n), rtol=1e-7)
    np.testing.assert_allclose(ALiBi(n).slopes.numpy(), R.alibi_slopes(n), rtol=1e-7)


@given(st.integers(1, 12), st.integers(1, 40))
def test_bias_matches_reference(n_heads, seq):
    alibi = ALiBi(n_heads)
    np.testing.assert_allclose(
        alibi.bias(seq, causal=False).numpy(), R.alibi_bias(seq, n_heads, causal=False), atol=1e-5, rtol=1e-6
    )
    np.testing.assert_array_equal(
        np.isneginf(alibi.bias(seq).numpy()), np.isneginf(R.alibi_bias(seq, n_heads, causal=True))
    )


def test_bias_for_cached_queries_is_the_last_rows():
    alibi = ALiBi(4)
    torch.testing.assert_close(alibi.bias(3, 10), alibi.bias(10)[:, -3:])
    torch.testing.assert_close(alibi.bias(3, 10, causal=False), alibi.bias(10, causal=False)[:, -3:])


def test_bias_is_monotone_in_distance_and_defined_at_any_length():
    bias = ALiBi(8).bias(3000, causal=False)
    row = bias[:, 1500]
    assert torch.isfinite(bias).all()
    left, right = row[:, :1501], row[:, 1500:]
    assert (left.diff(dim=-1) > 0).all() and (right.diff(dim=-1) < 0).all()
    # offset 5 gets the same bias at position 3 and position 2995
    torch.testing.assert_close(bias[:, 8, 3], bias[:, 2999, 2994])


def test_learnable_slopes_train_and_stay_positive():
    alibi = ALiBi(4, learnable=True)
    opt = torch.optim.SGD(alibi.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        alibi.bias(6, causal=False).sum().neg().backward()  # pushes slopes towards zero
        opt.step()
    assert (alibi.slopes > 0).all()
    assert not torch.allclose(alibi.slopes, alibi_slopes(4))


def test_custom_slopes():
    alibi = ALiBi(2, slopes=[0.5, 0.1])
    np.testing.assert_allclose(alibi.bias(3, causal=False)[1, 0].numpy(), [0, -0.1, -0.2], atol=1e-7)
