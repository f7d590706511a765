"""KerpleBias against posenc.reference.kerple_bias; the paper's initialisation and clamps; gradients."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import KerpleBias
from posenc import reference as R


@given(st.sampled_from(["log", "power"]), st.integers(1, 6), st.integers(1, 40), st.integers(0, 20))
def test_bias_matches_reference(kind, n_heads, q_len, extra):
    torch.manual_seed(q_len)
    kerple = KerpleBias(n_heads, kind)
    r1, r2 = kerple.coefficients()
    want = R.kerple_bias(q_len, q_len + extra, r1, r2, kind)
    got = kerple.bias(q_len, q_len + extra, causal=False)
    np.testing.assert_allclose(got.detach().double().numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,high1,high2", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_initialisation_as_the_paper_code(kind, high1, high2):
    torch.manual_seed(0)
    kerple = KerpleBias(512, kind)
    for p, high in ((kerple.r1.detach(), high1), (kerple.r2.detach(), high2)):
        assert 0 <= float(p.min()) and float(p.max()) <= high
        assert float(p.max()) > 0.9 * high and float(p.min()) < 0.1 * high  # uniform over (0, high)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_not_zero_and_both_parameters_get_gradients(kind):
    """Guards against ports whose bias is identically zero (or whose parameters never train)."""
    torch.manual_seed(1)
    kerple = KerpleBias(4, kind)
    assert float(kerple.bias(20, causal=False).detach()[:, -1, 0].abs().min()) > 1e-3
    for seq in (16, 300):  # the materialised path and the blocked kernel
        q, k, v = (torch.randn(1, 4, seq, 8) for _ in range(3))
        kerple.zero_grad()
        posenc.attention(q, k, v, bias=kerple).square().sum().backward()
        for p in (kerple.r1, kerple.r2):
            assert p.grad is not None and bool((p.grad.abs() > 0).all())


def test_clamps_keep_positive_and_pass_gradients():
    kerple = KerpleBias(2, "power")
    with torch.no_grad():
        kerple.r1.copy_(torch.tensor([-1.0, 0.5]))
        kerple.r2.copy_(torch.tensor([3.0, -0.2]))
    r1, r2 = kerple.coefficients()
    torch.testing.assert_close(r1, torch.tensor([0.01, 0.5]))
    torch.testing.assert_close(r2, torch.tensor([2.0, 0.01]))
    kerple.bias(5, causal=False).sum().backward()
    assert bool((kerple.r1.grad != 0).all()) and bool((kerple.r2.grad != 0).all())
    assert torch.isfinite(kerple.r2.grad).all()  # d^r2 at d = 0 has no NaN gradient


def test_kind_error():
    with pytest.raises(ValueError, match="kind must be one of 'log', 'power'; got 'exp'"):
        KerpleBias(2, "exp")
