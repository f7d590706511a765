"""SandwichBias against posenc.reference.sandwich_bias (inner products of sinusoidal embeddings)."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import SandwichBias
from posenc import reference as R


@given(st.integers(1, 9), st.sampled_from([2, 8, 16, 128]), st.integers(1, 40), st.integers(0, 30))
def test_bias_matches_reference(n_heads, dim, q_len, extra):
    got = SandwichBias(n_heads, dim).bias(q_len, q_len + extra, causal=False)
    want = R.sandwich_bias(q_len, q_len + extra, n_heads, dim)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6, atol=1e-5)


def test_shape_of_the_bias():
    """Zero on the diagonal, negative elsewhere, head h scaled by H / (8h), no parameters."""
    sandwich = SandwichBias(4, 128)
    bias = sandwich.bias(600, causal=False)
    assert list(sandwich.parameters()) == []
    assert float(bias.diagonal(dim1=1, dim2=2).abs().max()) < 1e-4
    assert float(bias.max()) < 1e-4 and float(bias[:, 599, :590].max()) < 0
    torch.testing.assert_close(bias[1] * 2, bias[0])
    torch.testing.assert_close(bias[3] * 4, bias[0])
    # a long decay: near keys are strictly preferred over far ones on average
    row = bias[0, 599].flip(0)
    assert float(row[1:50].mean()) > float(row[200:400].mean())


def test_dim_must_be_even():
    with pytest.raises(ValueError, match="dim must be even"):
        SandwichBias(2, 7)
