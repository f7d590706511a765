"""FireBias against posenc.reference.fire_bias: values, decoding positions, the threshold's default,
gradients."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import FireBias

from .oracles import make_bias, oracle_bias


@given(st.integers(1, 5), st.integers(1, 30), st.integers(0, 30), st.sampled_from([4, 32]))
def test_bias_matches_reference(n_heads, q_len, extra, train_len):
    torch.manual_seed(n_heads)
    fire = FireBias(n_heads, hidden=8, train_len=train_len)
    got = fire.bias(q_len, q_len + extra, causal=False)
    np.testing.assert_allclose(
        got.detach().double().numpy(), oracle_bias(fire, q_len, q_len + extra), atol=1e-5
    )


def test_decoding_queries_take_their_true_positions():
    """Past the threshold the normaliser depends on i: the last rows of a long bias, not a short one."""
    fire = make_bias("fire", 3)
    full = fire.bias(40, causal=False)
    torch.testing.assert_close(fire.bias(3, 40, causal=False), full[:, -3:])
    assert not torch.allclose(full[:, -1, -5:], full[:, 20, 16:21])  # same distances, other normaliser


def test_threshold_defaults_to_the_training_length():
    """With L = T the MLP sees inputs up to ~1 in training; with the paper's L = 512 and T = 64, up to 0.5."""
    default = FireBias(2, train_len=64)
    assert float(default.threshold.detach()) == 64.0
    i = torch.arange(64.0)
    with torch.no_grad():
        u = default.normalised_distance(i[:, None], torch.zeros(1))
    assert float(u.max()) > 0.99
    paper = FireBias(2, train_len=64, threshold=512)
    with torch.no_grad():
        u = paper.normalised_distance(i[:, None], torch.zeros(1))
    assert float(u.max()) < 0.51
    ref = math.log(0.1 * 63 + 1) / (math.log(0.1 * 512 + 1) + 1e-6)
    assert abs(float(u.max()) - ref) < 1e-6


def test_every_parameter_gets_a_gradient_through_attention():
    fire = make_bias("fire", 4)
    q, k, v = (torch.randn(1, 4, 200, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    posenc.attention(q, k, v, bias=fire).square().sum().backward()
    for name, p in fire.named_parameters():
        assert p.grad is not None and float(p.grad.abs().max()) > 0, name


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="train_len must be an integer >= 1, got 0"):
        FireBias(2, train_len=0)
    with pytest.raises(ValueError, match="threshold must be a finite number > 0"):
        FireBias(2, train_len=8, threshold=-1)
    with pytest.raises(ValueError, match="hidden must be an integer >= 1"):
        FireBias(2, hidden=0, train_len=8)


@given(st.integers(0, 10_000), st.booleans())
def test_piecewise_linear_tile_equals_the_mlp(seed, zero_weights):
    """tile() evaluates f through its breakpoints; the MLP itself (score_mod's form) gives the same values."""
    gen = torch.Generator().manual_seed(seed)
    fire = FireBias(3, hidden=6, train_len=8).double()
    with torch.no_grad():
        for p in fire.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
        if zero_weights:
            fire.mlp[0].weight[::2] = 0.0
    q_pos, k_pos = torch.arange(20, 30), torch.arange(30)
    with torch.no_grad():
        want = fire._mlp(fire.normalised_distance(q_pos[:, None], k_pos[None, :])).permute(2, 0, 1)
        torch.testing.assert_close(fire.tile(q_pos, k_pos), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_fire_bias_is_the_float32_one_to_its_rounding(dtype):
    """The breakpoint of a unit that never switches was a 1e30 sentinel, which half precision cannot hold:
    ``FireBias(...).half().bias(8)`` raised an overflow error deep in torch."""
    fire = posenc.FireBias(4, train_len=64)
    want = fire.bias(8).detach()
    got = fire.to(dtype).bias(8).detach()
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    torch.testing.assert_close(got.float()[finite], want[finite], rtol=0.02, atol=0.02)
