"""The blocked score-bias attention (posenc.kernels.bias_blocked) against posenc.reference.attention with each
scheme's oracle bias (float32 values) and against autograd through the materialised bias (float64 gradients,
gradcheck), and its memory: linear in L."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernels.bias_blocked import bias_attention_blocked

from ..bias.oracles import NAMES, make_bias, oracle_attention
from ..peak_memory import peak_rise_mib
from ..qkv import random_qkv


@st.composite
def case(draw):
    kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    k_len = draw(st.integers(1, 40))
    return dict(
        name=draw(st.sampled_from(NAMES)),
        batch=draw(st.integers(1, 2)),
        heads=kv_heads * group,
        kv_heads=kv_heads,
        q_len=draw(st.integers(1, k_len)),
        k_len=k_len,
        head_dim=draw(st.sampled_from([4, 8])),
        v_dim=draw(st.sampled_from([4, 6])),
        causal=draw(st.booleans()),
        block=draw(st.integers(1, 16)),
    )


@given(case())
def test_matches_reference_float32(c):
    q, k, v = random_qkv(c)
    bias = make_bias(c["name"], c["heads"])
    got = bias_attention_blocked(q, k, v, bias, causal=c["causal"], block=c["block"])
    want = oracle_attention(q, k, v, bias, c["causal"])
    np.testing.assert_allclose(got.detach().double().numpy(), want, atol=2e-5, rtol=0)


def _materialised(q, k, v, bias, causal):
    g = q.shape[1] // k.shape[1]
    mask = bias.bias(q.shape[2], k.shape[2], causal=causal).to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask
    )


@settings(max_examples=25)
@given(case())
def test_gradients_match_materialised_float64(c):
    """q, k, v and every parameter of the bias (a table's gradient is the sum of dS along each diagonal)."""
    q, k, v = random_qkv(c, torch.float64, grad=True)
    bias = make_bias(c["name"], c["heads"]).double()
    got = bias_attention_blocked(q, k, v, bias, causal=c["causal"], block=c["block"])
    want = _materialised(q, k, v, bias, c["causal"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    params = [q, k, v, *bias.parameters()]
    grad = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for g, w in zip(
        torch.autograd.grad(got, params, grad, allow_unused=True),
        torch.autograd.grad(want, params, grad, allow_unused=True),
        strict=True,
    ):
        if w is None:
            assert g is None or float(g.abs().max()) == 0
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_fire_blocks_cross_every_segment(causal):
    """FIRE's own block walker (a table for the rows before the threshold, each later row's segments searched
    in that row, the parameters' gradients summed by hand) against autograd through the materialised bias in
    float64, with the MLP's 32 breakpoints spread over [0, 1] so that rows cross every segment, in blocks that
    straddle the threshold, and decoding queries (q_len < k_len)."""
    bias = posenc.FireBias(3, hidden=32, train_len=100, threshold=90.5).double()
    with torch.no_grad():
        bias.mlp[0].weight.fill_(1.0)
        bias.mlp[0].bias.copy_(-torch.linspace(0.01, 0.99, 32, dtype=torch.float64))
        bias.c.fill_(0.3)
    gen = torch.Generator().manual_seed(5)
    for q_len in (300, 37):
        q = torch.randn(2, 3, q_len, 8, generator=gen, dtype=torch.float64, requires_grad=True)
        k, v = (
            torch.randn(2, 3, 300, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in "kv"
        )
        got = bias_attention_blocked(q, k, v, bias, causal=causal, block=64)
        want = _materialised(q, k, v, bias, causal)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        params = [q, k, v, *bias.parameters()]
        grad = torch.randn(got.shape, dtype=torch.float64, generator=gen)
        for g, w in zip(
            torch.autograd.grad(got, params, grad), torch.autograd.grad(want, params, grad), strict=True
        ):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name,causal", [("t5", True), ("kerple-log", False), ("fire", True)])
def test_gradcheck(name, causal):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = make_bias(name, 2).double()
    # gradcheck perturbs its inputs in place, so passing the module's own parameters checks their gradients
    assert torch.autograd.gradcheck(
        lambda q, k, v, *params: bias_attention_blocked(q, k, v, bias, causal=causal, scale=0.7, block=2),
        (q, k, v, *bias.parameters()),
    )


@pytest.mark.parametrize(
    "make,seq,bound_mib",
    [("posenc.KerpleBias(4)", 8192, 256), ("posenc.FireBias(4, train_len=64)", 8192, 384)],
)
def test_memory_stays_linear(make, seq, bound_mib):
    """Forward and backward with a learnable bias, 4 heads: the peak RSS rise stays far below the materialised
    bias alone (1 GiB at L = 8192): O(L) buffers plus block temporaries capped whatever L (a table bias's
    at TABLE_BACKWARD_ELEMS, 128 MiB; a tile bias's at TILE_ELEMS, 256 MiB)."""
    setup = f"from posenc.kernels.bias_blocked import bias_attention_blocked; bias = {make}"
    rise_mib = peak_rise_mib(setup, "bias_attention_blocked(q, k, v, bias)", seq)
    assert rise_mib < bound_mib, f"peak RSS rose by {rise_mib:.0f} MiB"


def test_errors_name_the_argument():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    bias = make_bias("t5", 4)
    with pytest.raises(ValueError, match=r"bias must be a posenc ScoreBias with n_heads=4.*n_heads=3"):
        bias_attention_blocked(q, k, k, make_bias("t5", 3))
    with pytest.raises(ValueError, match="bias must be a posenc ScoreBias"):
        bias_attention_blocked(q, k, k, torch.zeros(4, 5, 5))
    with pytest.raises(ValueError, match="block must be an integer >= 1, got 0"):
        bias_attention_blocked(q, k, k, bias, block=0)
    with pytest.raises(ValueError, match="q_len must be <= k_len"):
        bias_attention_blocked(q, k[:, :, :3], k[:, :, :3], bias)
    with pytest.raises(ValueError, match="kv_heads dividing heads"):
        bias_attention_blocked(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), bias)
    with pytest.raises(ValueError, match="v must be a floating tensor"):
        bias_attention_blocked(q, k, k[0], bias)
