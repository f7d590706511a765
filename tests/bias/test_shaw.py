"""ShawRelative (Shaw et al. 2018) against posenc.reference.shaw_attention (values) and a plain-torch
attention that materialises the (Lq, Lk, dim) relative tensors as the paper writes them (values and
gradients); the query-blocked kernel against its own one-block path; memory, torch.compile and errors."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference as R

from ..peak_memory import peak_rise_mib
from ..qkv import draw_shapes, random_qkv


@st.composite
def case(draw):
    return dict(
        draw_shapes(draw),
        max_distance=draw(st.one_of(st.integers(1, 6), st.integers(20, 60))),  # also past every distance
        causal=draw(st.booleans()),
        block=draw(st.one_of(st.none(), st.integers(1, 8))),
        scale=draw(st.sampled_from([None, 0.7])),
    )


def _module(c, dtype=torch.float32):
    shaw = posenc.ShawRelative(c["head_dim"], c["max_distance"], v_dim=c["v_dim"]).to(dtype)
    gen = torch.Generator().manual_seed(c["max_distance"])
    with torch.no_grad():
        for p in shaw.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return shaw


def _materialised(q, k, v, shaw, causal, scale=None):
    """Shaw et al.'s eq. 3-5 as written: a^K and a^V gathered into (Lq, Lk, dim) tensors."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    lq, lk = q.shape[2], k.shape[2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    i, j = torch.arange(lk - lq, lk)[:, None], torch.arange(lk)[None, :]
    m = shaw.max_distance
    rel = torch.clamp(j - i, -m, m) + m
    a_k, a_v = shaw.key_table[rel], shaw.value_table[rel]  # (Lq, Lk, dim)
    e = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a_k)) * scale
    if causal:
        e = e.masked_fill(j > i, -math.inf)
    p = torch.softmax(e, -1)
    return p @ v + torch.einsum("bhij,ijd->bhid", p, a_v)


def _oracle(q, k, v, shaw, causal, scale=None):
    g = q.shape[1] // k.shape[1]
    kk, vv = (np.repeat(t.detach().double().numpy(), g, axis=1) for t in (k, v))
    return R.shaw_attention(q, kk, vv, shaw.key_table, shaw.value_table, causal, scale)


@given(case())
def test_matches_reference_float32(c):
    q, k, v = random_qkv(c)
    shaw = _module(c)
    got = shaw.attend(q, k, v, causal=c["causal"], scale=c["scale"], block=c["block"])
    want = _oracle(q, k, v, shaw, c["causal"], c["scale"])
    np.testing.assert_allclose(got.detach().double().numpy(), want, atol=3e-5, rtol=0)
    via_attention = posenc.attention(q, k, v, bias=shaw, causal=c["causal"], scale=c["scale"])
    np.testing.assert_allclose(via_attention.detach().double().numpy(), want, atol=3e-5, rtol=0)


@settings(max_examples=25)
@given(case())
def test_gradients_match_materialised_float64(c):
    q, k, v = random_qkv(c, torch.float64, grad=True)
    shaw = _module(c, torch.float64)
    got = shaw.attend(q, k, v, causal=c["causal"], scale=c["scale"], block=c["block"])
    want = _materialised(q, k, v, shaw, c["causal"], c["scale"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    params = [q, k, v, *shaw.parameters()]
    grad = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = torch.autograd.grad(got, params, grad), torch.autograd.grad(want, params, grad)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck(causal):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    shaw = posenc.ShawRelative(4, 2, v_dim=3).double()
    # gradcheck perturbs its inputs in place, so passing the module's own parameters checks their gradients
    assert torch.autograd.gradcheck(
        lambda q, k, v, *params: shaw.attend(q, k, v, causal=causal, scale=0.7, block=2),
        (q, k, v, *shaw.parameters()),
    )


@pytest.mark.parametrize("causal", [True, False])
def test_blocked_equals_one_block(causal):
    """Several blocks (and the default sizing, blocked at this length) against one materialised block."""
    c = dict(batch=1, heads=4, kv_heads=2, q_len=300, k_len=320, head_dim=8, v_dim=8)
    q, k, v = random_qkv(c, grad=True)
    shaw = posenc.ShawRelative(8, 16)
    direct = shaw.attend(q, k, v, causal=causal, block=300)
    grad = torch.randn(direct.shape, generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(direct, [q, k, v, *shaw.parameters()], grad)
    assert posenc.attention(q, k, v, bias=shaw, causal=causal).requires_grad
    for block in (None, 64, 7):
        got = shaw.attend(q, k, v, causal=causal, block=block)
        torch.testing.assert_close(got, direct, rtol=0, atol=2e-6)
        for g, w in zip(torch.autograd.grad(got, [q, k, v, *shaw.parameters()], grad), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)  # the end rows sum ~10^4 terms


def test_with_rotary_matches_reference():
    """rotary= and bias= together: q and k rotated (posenc.reference.rope), then Shaw's attention."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=gen) for _ in range(3))
    shaw = posenc.ShawRelative(8, 2)
    got = posenc.attention(q, k, v, rotary=posenc.RotaryEmbedding(8), bias=shaw)
    pos = np.arange(6)
    want = R.shaw_attention(
        R.rope(q.numpy(), pos), R.rope(k.numpy(), pos), v, shaw.key_table, shaw.value_table, causal=True
    )
    np.testing.assert_allclose(got.detach().double().numpy(), want, atol=3e-6, rtol=0)


@given(st.integers(0, 10_000), st.integers(1, 8))
def test_key_term_depends_on_the_clipped_distance_only(shift, max_distance):
    shaw = posenc.ShawRelative(4, max_distance)
    q = torch.randn(1, 4, 9, 4, generator=torch.Generator().manual_seed(max_distance))
    pos = torch.arange(9)
    base = shaw.key_bias(q, pos, pos)
    torch.testing.assert_close(shaw.key_bias(q, pos + shift, pos + shift), base, rtol=0, atol=0)
    rel = q @ shaw.key_table.T  # (1, 4, 9, 2k + 1): query a against every table row
    row = (pos[None, :] - pos[:, None]).clamp(-max_distance, max_distance) + max_distance
    want = torch.stack([rel[:, :, a, row[a]] for a in range(9)], dim=2)
    torch.testing.assert_close(base, want, rtol=0, atol=0)


def test_initialisation_is_tensor2tensors():
    """tf.variance_scaling_initializer(1.0, fan_avg, uniform) of a (2k + 1, d) table: U(-a, a),
    a = sqrt(3 / ((2k + 1 + d) / 2))."""
    torch.manual_seed(0)
    shaw = posenc.ShawRelative(64, 16, v_dim=32)
    for table, d in ((shaw.key_table.detach(), 64), (shaw.value_table.detach(), 32)):
        bound = math.sqrt(3 / ((33 + d) / 2))
        assert table.shape == (33, d)
        assert float(table.abs().max()) <= bound and float(table.abs().max()) > 0.95 * bound
        assert abs(float(table.std()) - bound / math.sqrt(3)) < 0.05 * bound


def test_memory_stays_linear():
    """Forward and backward at L = 4096, 4 heads: the peak RSS rise stays far below one materialised
    (heads, L, L) float32 score tensor (256 MiB; the paper's (L, L, dim) tensors alone would be 2 GiB)."""
    rise_mib = peak_rise_mib("bias = posenc.ShawRelative(16)", "posenc.attention(q, k, v, bias=bias)", 4096)
    assert rise_mib < 128, f"peak RSS rose by {rise_mib:.0f} MiB"


def test_a_max_distance_past_the_length_costs_what_the_length_does():
    """The band was formed over all 2 max_distance + 1 distances though only 2 L - 1 occur: max_distance
    8192 at L = 512 took seconds and ~500 MiB. Forward and backward at L = 1024 now stay with what
    max_distance 16 takes there (about 50 MiB)."""
    rise_mib = peak_rise_mib(
        "bias = posenc.ShawRelative(16, max_distance=8192)", "posenc.attention(q, k, v, bias=bias)", 1024
    )
    assert rise_mib < 128, f"peak RSS rose by {rise_mib:.0f} MiB"


@pytest.mark.parametrize("seq", [12, 300])
def test_torch_compile_matches_eager(seq):
    """The one-block path (12) is traced; the blocked path (300) runs eagerly behind a graph break."""
    torch._dynamo.reset()
    c = dict(batch=1, heads=4, kv_heads=2, q_len=seq, k_len=seq, head_dim=8, v_dim=8)
    q, k, v = random_qkv(c, grad=True)
    shaw = posenc.ShawRelative(8, 4)

    def loss(q, k, v):
        return posenc.attention(q, k, v, bias=shaw).square().sum()

    params = [q, k, v, *shaw.parameters()]
    got = torch.compile(loss, backend="aot_eager")(q, k, v)
    want = loss(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for g, w in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_errors_name_the_argument():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="max_distance must be an integer >= 1, got 0"):
        posenc.ShawRelative(8, 0)
    with pytest.raises(ValueError, match="head_dim must be an integer >= 1, got -2"):
        posenc.ShawRelative(-2)
    with pytest.raises(ValueError, match="v_dim must be an integer >= 1, got 1.5"):
        posenc.ShawRelative(8, v_dim=1.5)
    with pytest.raises(ValueError, match="q has last dimension 8, but ShawRelative was built for 16"):
        posenc.attention(q, k, k, bias=posenc.ShawRelative(16))
    with pytest.raises(ValueError, match="v has last dimension 8, but ShawRelative was built for 4"):
        posenc.attention(q, k, k, bias=posenc.ShawRelative(8, v_dim=4))
    with pytest.raises(ValueError, match="causal attention needs q_len <= k_len"):
        posenc.attention(q, k[:, :, :3], k[:, :, :3], bias=posenc.ShawRelative(8))
    with pytest.raises(ValueError, match="q_len must be <= k_len"):
        posenc.ShawRelative(8).attend(q, k[:, :, :3], k[:, :, :3], causal=False)
    with pytest.raises(ValueError, match="block must be an integer >= 1, got 0"):
        posenc.ShawRelative(8).attend(q, k, k, block=0)
    with pytest.raises(ValueError, match="causal must be True or False"):
        posenc.ShawRelative(8).attend(q, k, k, causal=None)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        posenc.ShawRelative(8).attend(q, k, k, scale=-1.0)


@pytest.mark.parametrize("bias", [posenc.ShawRelative(8, v_dim=3), posenc.CoPE(8, 4)], ids=["shaw", "cope"])
def test_no_queries_give_an_empty_output(bias):
    q, k, v = torch.randn(1, 2, 0, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 3)
    assert bias.attend(q, k, v).shape == (1, 2, 0, 3)
